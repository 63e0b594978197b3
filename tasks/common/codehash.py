"""The code a step runs: the closure of a module's imports inside this repository, and its hash.

Caches key on it (Prefect's seed tasks, DVC's stage deps), so a change to evaluation code never
retrains and a README edit recomputes nothing. Imports are read statically from the source (every
``import`` and ``from ... import`` anywhere in the file, including inside functions); a module reached
only through ``importlib`` is not seen, which is why papers import their own modules plainly.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

from tasks.common.env import repo_root
from tasks.common.provenance import hash_files

LOCAL_PACKAGES = ("tasks", "flows")


def module_path(module: str, root: Path) -> Path | None:
    """``tasks.x.y`` -> ``tasks/x/y.py`` or ``tasks/x/y/__init__.py``; None outside this repository."""
    if module.split(".")[0] not in LOCAL_PACKAGES:
        return None
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path) -> set[str]:
    """Names of the modules ``path`` imports (``from a.b import c`` yields ``a.b`` and ``a.b.c``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = _module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _with_packages(module: str) -> list[str]:
    """A module and the packages above it (``a.b.c`` -> ``a``, ``a.b``, ``a.b.c``): importing it runs them."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def code_closure(entry_modules: Iterable[str], root: Path | None = None) -> list[str]:
    """Repository-relative paths of every local file the entry modules import, transitively, sorted."""
    root = root or repo_root()
    todo = [m for entry in entry_modules for m in _with_packages(entry)]
    seen: dict[str, Path] = {}
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        path = module_path(module, root)
        if path is None:
            continue
        seen[module] = path
        for imported in imported_modules(path, root):
            todo.extend(m for m in _with_packages(imported) if m not in seen)
    missing = [m for m in entry_modules if m not in seen]
    if missing:
        raise ModuleNotFoundError(f"no such module in this repository: {', '.join(missing)}")
    return sorted({p.relative_to(root).as_posix() for p in seen.values()})


def code_version(entry_modules: Iterable[str], root: Path | None = None) -> str:
    """Content hash of ``code_closure(entry_modules)``."""
    return hash_files(code_closure(entry_modules, root), root)
