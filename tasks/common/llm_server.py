"""A real OpenAI-compatible server for the cpu profile: ``transformers serve`` on a tiny local model.

``transformers_server(model_dir)`` starts the ``transformers serve`` CLI (the ``serving`` extra) on
127.0.0.1 at a free port, pinned to one local model directory, offline (``HF_HUB_OFFLINE=1``), waits
until ``/health`` answers, yields a :class:`ServerHandle` (``base_url`` ends in ``/v1``, ready for the
``openai`` client), and always stops the whole process group on exit. The paper profile points the same
client (``tasks.common.llm_policy.OpenAIServerPolicy``) at a vLLM server URL from params instead.

``build_tiny_local_model(directory, seed)`` writes a model folder that server can load with no network:
a byte-level tokenizer built in code (256 byte tokens + ``<|endoftext|>``, a one-line chat template) and
a tiny GPT-2 (``tasks.common.tiny_lm``) trained for a few steps on a fixed toy corpus, so that greedy
output is not uniform noise.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from tasks.common.io import write_dir_with
from tasks.common.tiny_lm import build_tiny_gpt2, tiny_gpt2_config, train_causal_lm

EOS_TOKEN = "<|endoftext|>"
# Plain-text chat format ("role: content" lines, then "assistant:"); tiny models have no instruction tuning.
TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)
# A fixed toy corpus: enough structure for a 2-layer model to learn in a few hundred steps.
_SUBJECTS = ("the cat", "the dog", "a bird", "the fox", "my friend")
_VERBS = ("sat on", "looked at", "ran to", "jumped over", "slept near")
_OBJECTS = ("the mat.", "the tree.", "the house.", "the river.", "a red box.")


def toy_corpus() -> list[str]:
    """All 125 subject-verb-object sentences of the toy grammar, in a fixed order."""
    return [f"{s} {v} {o}" for s in _SUBJECTS for v in _VERBS for o in _OBJECTS]


def build_byte_tokenizer():
    """A byte-level tokenizer (no merges): ids 0..255 are the bytes, 256 is ``<|endoftext|>``.

    Every string round-trips exactly (``decode(encode(s)) == s``), and offsets are character offsets,
    which keeps prompt/continuation boundaries simple for scoring.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {char: index for index, char in enumerate(alphabet)}
    vocab[EOS_TOKEN] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, eos_token=EOS_TOKEN, pad_token=EOS_TOKEN,
                                   chat_template=TINY_CHAT_TEMPLATE)


def _toy_batches(tokenizer, seq_len: int, batch_size: int):
    """A sampler of (B, seq_len) windows of the shuffled corpus joined by ``<|endoftext|>``."""
    ids = tokenizer(tokenizer.eos_token.join(toy_corpus()))["input_ids"]
    stream = torch.tensor(ids, dtype=torch.long)

    def sample(generator: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(stream) - seq_len, (batch_size,), generator=generator)
        return torch.stack([stream[s:s + seq_len] for s in starts.tolist()])

    return sample


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """Run a block with ``count`` intra-op threads, then restore the previous count (process-wide).

    Tiny models gain nothing from more threads, and on a busy 2-core machine two OpenMP threads that
    spin-wait for each other made a training step 20 times slower (0.85 s against 0.04 s) than one.
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_tiny_local_model(directory: str | Path, seed: int = 0, train_steps: int = 200, n_embd: int = 64,
                           n_layer: int = 2) -> Path:
    """Write a servable tiny causal LM folder (config, safetensors, tokenizer, generation config).

    The generation config has ``do_sample=True, top_k=0, top_p=1.0``: ``transformers serve`` sets
    ``do_sample=False`` for ``temperature=0`` but never turns sampling on itself, so a positive
    temperature samples (plain temperature sampling) only when the model's own config says so.
    Written atomically; reproducible from ``seed`` (torch's CPU kernels, fixed thread count aside).
    """
    from transformers import GenerationConfig

    tokenizer = build_byte_tokenizer()
    eos_id = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    config = tiny_gpt2_config(vocab_size=len(tokenizer), n_positions=256, n_layer=n_layer, n_head=2, n_embd=n_embd)
    config.eos_token_id = config.bos_token_id = config.pad_token_id = eos_id
    model = build_tiny_gpt2(config, seed)
    if train_steps > 0:
        with torch_threads(1):
            train_causal_lm(model, _toy_batches(tokenizer, seq_len=48, batch_size=8), steps=train_steps, lr=3e-3,
                            seed=seed)
    model.eval()
    model.generation_config = GenerationConfig(eos_token_id=eos_id, pad_token_id=eos_id, do_sample=True, top_k=0,
                                               top_p=1.0, temperature=1.0)

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return write_dir_with(directory, write)


# --------------------------------------------------------------------------------------------
# The server process


@dataclass(frozen=True)
class ServerHandle:
    """A running server: ``base_url`` for the ``openai`` client, ``model`` to name in requests."""

    base_url: str
    model: str
    port: int
    pid: int
    log_path: Path
    start_seconds: float


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (the server binds it right after)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts TCP connections on ``host:port``."""
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError as err:
        return f"<no log at {path}: {err}>"


def _health_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2.0) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def serve_command(model: str, port: int, device: str = "cpu") -> list[str]:
    """The ``transformers serve`` command line: the console script of this interpreter's environment."""
    script = Path(sys.executable).parent / "transformers"
    launcher = [str(script)] if script.exists() else [sys.executable, "-m", "transformers.cli.transformers"]
    return [*launcher, "serve", model, "--host", "127.0.0.1", "--port", str(port), "--device", device,
            "--log-level", "info"]


def _stop_group(process: subprocess.Popen, wait_s: float = 15.0) -> None:
    """SIGTERM the process group, SIGKILL whatever is left, and reap the leader."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=wait_s)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=10)


@contextlib.contextmanager
def transformers_server(model_dir: str | Path, timeout_s: float = 120.0, device: str = "cpu",
                        log_dir: str | Path | None = None, threads: int | None = 1) -> Iterator[ServerHandle]:
    """Run ``transformers serve <model_dir>`` on 127.0.0.1:<free port> for the duration of the block.

    Waits until ``GET /health`` answers 200 (the pinned model is loaded before the app starts listening),
    raising ``RuntimeError`` (process exited) or ``TimeoutError`` with the server log's tail otherwise.
    The process runs in its own session and its whole group is killed on exit, whatever happened.
    The log goes to ``log_dir`` (kept) or to a temporary folder (removed on exit). ``threads`` sets the
    server's ``OMP_NUM_THREADS``/``MKL_NUM_THREADS`` (1 suits tiny models; ``None`` inherits the environment).
    """
    model = str(Path(model_dir).resolve())
    if not Path(model, "config.json").exists():
        raise FileNotFoundError(f"{model} has no config.json; build one with build_tiny_local_model")
    own_log_dir = log_dir is None
    log_folder = Path(tempfile.mkdtemp(prefix="transformers-serve-")) if own_log_dir else Path(log_dir)
    log_folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = log_folder / f"transformers-serve-{port}.log"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    if threads is not None:
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    started = time.monotonic()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(serve_command(model, port, device), env=env, stdout=log, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        health = f"http://127.0.0.1:{port}/health"
        deadline = started + timeout_s
        while not _health_ok(health):
            if process.poll() is not None:
                raise RuntimeError(f"transformers serve exited with code {process.returncode} before answering; "
                                   f"log {log_path}:\n{_log_tail(log_path)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"transformers serve did not answer {health} within {timeout_s:.0f} s; "
                                   f"log {log_path}:\n{_log_tail(log_path)}")
            time.sleep(0.2)
        yield ServerHandle(base_url=f"http://127.0.0.1:{port}/v1", model=model, port=port, pid=process.pid,
                           log_path=log_path, start_seconds=time.monotonic() - started)
    finally:
        _stop_group(process)
        if own_log_dir:
            shutil.rmtree(log_folder, ignore_errors=True)
