"""Atomic file writes: write to a temporary sibling, fsync, then ``os.replace``.

A run killed at any instant leaves either the old file or the complete new one, never a
half-written output (``os.replace`` is atomic on POSIX within one filesystem).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".partial"


def _umask() -> int:
    """The process umask: from /proc on Linux (no side effect); elsewhere by setting and restoring it, which
    another thread could observe for an instant."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _respect_umask(path: Path, mode: int) -> None:
    """``mkstemp``/``mkdtemp`` create 0600/0700 whatever the umask; give outputs the permissions an ordinary
    ``open``/``mkdir`` would, so a teammate or a web server can read the reports."""
    os.chmod(path, mode & ~_umask())


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path next to ``target``; on success rename it onto ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    _respect_umask(tmp, 0o666)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text(target: str | Path, text: str) -> Path:
    with atomic_path(target) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(target)


def write_json(target: str | Path, obj: Any) -> Path:
    return write_text(target, json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def write_with(target: str | Path, writer: Callable[[Path], None]) -> Path:
    """Atomically write ``target`` with any library writer that takes a path (parquet, png, ...)."""
    with atomic_path(target) as tmp:
        writer(tmp)
    return Path(target)


def write_dir_with(directory: str | Path, writer: Callable[[Path], None]) -> Path:
    """Atomically write a whole folder (``save_pretrained``, ``Dataset.save_to_disk``, ...): the writer
    fills a sibling temp folder, which then replaces ``directory``."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=TMP_SUFFIX, dir=directory.parent))
    _respect_umask(tmp, 0o777)
    try:
        writer(tmp)
        if directory.exists():
            shutil.rmtree(directory)
        tmp.rename(directory)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return directory


def remove_partials(directory: str | Path) -> list[Path]:
    """Delete the temporary siblings (``.<name>.<random>.partial``) that a killed writer left behind.

    A SIGKILL cannot run the ``finally`` that removes them; the final paths are never half-written,
    so the debris is only ever temp files, cleared by the next run before it writes anything."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = sorted(p for p in directory.rglob(f".*{TMP_SUFFIX}") if p.name.startswith("."))
    for path in stale:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stale


def write_parquet(frame: Any, path: str | Path) -> Path:
    """A polars DataFrame as an atomic parquet file."""
    return write_with(path, lambda tmp: frame.write_parquet(tmp))


def save_state_dict(module: Any, path: str | Path) -> Path:
    """A torch module's parameters and buffers as an atomic safetensors file (contiguous CPU copies)."""
    from safetensors.torch import save_file

    state = {name: tensor.detach().cpu().contiguous() for name, tensor in module.state_dict().items()}
    return write_with(path, lambda tmp: save_file(state, str(tmp)))


def load_state_dict(module: Any, path: str | Path) -> Any:
    """Load a file written by ``save_state_dict`` into ``module`` (strict: every key must match)."""
    from safetensors.torch import load_file

    module.load_state_dict(load_file(str(path)))
    return module


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _json_default(obj: Any) -> Any:
    # numpy scalars and arrays appear in metrics; JSON needs plain Python numbers.
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")
