"""The paper profile of cacr [reconstructed]: a CLIP-family encoder for VBCS, a Qwen2.5-VL policy that reads
the candidates as text and answers with a pick-and-refine or a REJECT, and loaders for the temporal answer
grounding benchmarks. The benchmark list (MedVidQA, TutorialVQA, VehicleVQA, CMIVQA, Charades-STA,
ActivityNet Captions) is the project's guess from the abstract's "six benchmarks" and must be checked against
the paper. MedVidQA, TutorialVQA, VehicleVQA and CMIVQA are distributed as JSON annotation files (manual
download, not on the Hugging Face Hub); Charades-STA as "vid start end##sentence" lines; ActivityNet Captions
as {video: {duration, timestamps, sentences}} JSON. Tested with local stand-ins only
(``tests/unit/test_cacr_hub.py``); nothing here is run in this project.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.cacr import method


@dataclass(frozen=True)
class GroundingItem:
    """One question with its answer span in seconds, on an untrimmed video of ``duration`` seconds."""

    dataset: str
    video: str
    question: str
    start_s: float
    end_s: float
    duration_s: float


def seconds_to_frames(start_s: float, end_s: float, duration_s: float, frames: int) -> tuple[int, int]:
    """Inclusive frame indices of [start_s, end_s] when ``frames`` frames are sampled uniformly over the video
    (frame i covers [i, i + 1) * duration / frames)."""
    scale = frames / duration_s
    first = min(frames - 1, max(0, int(start_s * scale)))
    last = min(frames - 1, max(first, int(end_s * scale - 1e-9)))
    return first, last


def load_tagv_json(path: str | Path, dataset: str) -> list[GroundingItem]:
    """MedVidQA-style JSON: a list of {video_id, question, answer_start_second, answer_end_second,
    video_length} (the TAGV challenge format shared by MedVidQA, TutorialVQA, VehicleVQA and CMIVQA releases)."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))
    return [GroundingItem(dataset, str(r["video_id"]), r["question"], float(r["answer_start_second"]),
                          float(r["answer_end_second"]), float(r["video_length"])) for r in rows]


def load_charades_sta(path: str | Path, durations: dict[str, float]) -> list[GroundingItem]:
    """Charades-STA lines "video start end##sentence"; durations come from Charades' own metadata."""
    items = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        head, sentence = line.split("##", 1)
        video, start, end = head.split()
        items.append(GroundingItem("charades_sta", video, sentence.strip(), float(start), float(end),
                                   durations[video]))
    return items


def load_activitynet_captions(path: str | Path) -> list[GroundingItem]:
    """ActivityNet Captions JSON {video: {duration, timestamps: [[s, e], ...], sentences: [...]}}."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [GroundingItem("activitynet_captions", video, sentence.strip(), float(s), float(e), float(v["duration"]))
            for video, v in data.items() for (s, e), sentence in zip(v["timestamps"], v["sentences"])]


def load_clip(model_name: str, dtype: torch.dtype = torch.float32):
    """(model, processor) of a CLIP checkpoint, e.g. openai/clip-vit-large-patch14 (VBCS's VLP encoder)."""
    from transformers import CLIPModel, CLIPProcessor

    return CLIPModel.from_pretrained(model_name, torch_dtype=dtype).eval(), CLIPProcessor.from_pretrained(model_name)


def _pooled(output) -> torch.Tensor:
    """The projected embeddings: a tensor in transformers 4.x, ``pooler_output`` of a model output in 5.x."""
    return output if isinstance(output, torch.Tensor) else output.pooler_output


@torch.no_grad()
def clip_vbcs(model, frame_pixels: torch.Tensor, text_inputs: dict, lengths: list[int], nms_threshold: float,
              top_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """VBCS with a CLIP encoder: (T, 3, H, W) preprocessed frames and one tokenised question ->
    (K, 2) candidate frame segments and (K,) scores (Method step 1)."""
    frames = _pooled(model.get_image_features(pixel_values=frame_pixels))
    question = _pooled(model.get_text_features(**text_inputs))[0]
    similarity = method.frame_question_similarity(frames.float(), question.float())
    return method.vbcs_candidates(similarity, lengths, nms_threshold, top_k)


PROMPT = ("You are given a video of {frames} frames and a question. Candidate answer segments (frame ranges) "
          "found by retrieval:\n{candidates}\nQuestion: {question}\nReason about the temporal order of events, then "
          "answer with <answer>k a b</answer> to pick candidate k and refine its boundaries by a and b frames "
          "(|a|, |b| <= {max_offset}), or <answer>reject s e</answer> if no candidate is right, giving the "
          "answer segment s-e yourself.")


def build_prompt(question: str, candidates: torch.Tensor, frames: int, max_offset: int) -> str:
    """The policy's text prompt: numbered candidates with their frame ranges (the video goes in as frames)."""
    listed = "\n".join(f"{k + 1}. frames {int(s)}-{int(e)}" for k, (s, e) in enumerate(candidates.tolist()))
    return PROMPT.format(frames=frames, candidates=listed, question=question, max_offset=max_offset)


ANSWER = re.compile(r"<answer>\s*(reject|\d+)\s+(-?\d+)\s+(-?\d+)\s*</answer>", re.IGNORECASE)


def parse_answer(text: str, candidates: torch.Tensor, frames: int, max_offset: int
                 ) -> tuple[tuple[int, int], bool] | None:
    """(predicted segment, rejected) from the policy's text, or None when the answer is malformed (the format
    reward r_format of Method step 3 is then 0 and the tIoU reward 0)."""
    match = ANSWER.search(text)
    if match is None:
        return None
    head, a, b = match.group(1).lower(), int(match.group(2)), int(match.group(3))
    if head == "reject":
        if not (0 <= a < frames and 0 <= b < frames):
            return None
        return (min(a, b), max(a, b)), True
    k = int(head) - 1
    if not (0 <= k < len(candidates)) or abs(a) > max_offset or abs(b) > max_offset:
        return None
    return method.apply_offsets(tuple(candidates[k].tolist()), a, b, frames), False


def text_reward(text: str, gt: tuple[int, int], candidates: torch.Tensor, frames: int, max_offset: int,
                alpha: float, tau: float, format_weight: float) -> float:
    """R = tIoU + r_format + alpha * r_reject for a generated answer (Method step 3 with r_format)."""
    parsed = parse_answer(text, candidates, frames, max_offset)
    if parsed is None:
        return 0.0
    (s, e), rejected = parsed
    best = method.tiou_tensor(candidates, torch.tensor(gt)[None]).max()
    value = method.reward(torch.tensor([[s, e]]), torch.tensor([gt]), torch.tensor([rejected]), best[None], alpha, tau)
    return float(value) + format_weight
