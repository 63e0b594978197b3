"""Paper profile of constrained_unlearning: hub checkpoints and CLIP scoring (never called at smoke/cpu).

The paper's Stage B runs Stable Diffusion (``CompVis/stable-diffusion-v1-4``, ``nota-ai/bk-sdm-tiny``) and
DDPM-CelebA-HQ with LoRA, scored by CLIP. The loaders below exist and are tested with local stand-ins; the
training does not, so a config with the ``hub`` section is refused before any compute
(:func:`refuse_unimplemented`) instead of running the toy in its place. ``diffusers`` is not installed in this
project's environment: a clear error says so.
"""

from __future__ import annotations

import numpy as np

from tasks.constrained_unlearning.config import ConstrainedUnlearningConfig

HUB_NOT_IMPLEMENTED = ("constrained_unlearning.paper.hub: paper Stage B (Stable Diffusion / DDPM-CelebA-HQ + LoRA, "
                       "CLIP scoring) not implemented; remove the hub section to run the exact Stage A at this profile")


def refuse_unimplemented(cfg: ConstrainedUnlearningConfig) -> None:
    """A config naming the paper-scale models must not run the toy silently in their place: fail before any
    compute (data, train and evaluate all call this first)."""
    if cfg.hub is not None:
        raise NotImplementedError(HUB_NOT_IMPLEMENTED)


def load_diffusion_pipeline(name_or_path: str, dtype: str = "float16"):
    """A Stable Diffusion / DDPM pipeline by hub name (``CompVis/stable-diffusion-v1-4``,
    ``nota-ai/bk-sdm-tiny``, ``google/ddpm-celebahq-256``) or a local folder."""
    try:
        import diffusers
    except ImportError as err:
        raise ImportError("the paper profile of constrained_unlearning needs `diffusers` (and `peft` for LoRA): "
                          "pip install diffusers peft") from err
    import torch

    return diffusers.DiffusionPipeline.from_pretrained(name_or_path, torch_dtype=getattr(torch, dtype))


def load_clip(name_or_path: str):
    """CLIP model and processor (``openai/clip-vit-base-patch32``) for the concept score."""
    from transformers import CLIPModel, CLIPProcessor

    return CLIPModel.from_pretrained(name_or_path).eval(), CLIPProcessor.from_pretrained(name_or_path)


def clip_concept_score(model, processor, images, concept: str) -> np.ndarray:
    """Cosine similarity between each image and the text ``concept`` (the paper's unlearning score)."""
    import torch

    inputs = processor(text=[concept], images=images, return_tensors="pt", padding=True)
    with torch.no_grad():
        image = model.get_image_features(pixel_values=inputs["pixel_values"])
        text = model.get_text_features(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    image = image / image.norm(dim=-1, keepdim=True)
    text = text / text.norm(dim=-1, keepdim=True)
    return (image @ text.T)[:, 0].numpy()
