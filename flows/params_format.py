"""Write ``params.yaml`` in the layout DVC writes back, so ``dvc exp run -S key=value`` changes only its lines.

    python -m flows.params_format           # rewrite params.yaml in place (values and comments kept)
    python -m flows.params_format --check   # exit 1 when DVC would re-lay-out the file (a test runs this)

``dvc exp run -S`` applies its overrides with ``dvc.utils.hydra.apply_overrides``: it loads params.yaml with
ruamel's round-trip loader, merges the overridden config back into it (every list is replaced by a plain
list, so every list comes out in block style) and dumps it with ``default_flow_style=False`` at ruamel's
width of 80 columns, re-wrapping every long inline mapping. With the inline layout params.yaml used to have,
a two-value change was a 400-line diff. Here the file is put in that writer's fixed point: every mapping and
every list in block style, comments kept.
"""

from __future__ import annotations

import argparse
import io
import sys
from pathlib import Path
from typing import Any

from tasks.common.env import repo_root


def _yaml():
    """The dumper DVC uses (dvc/utils/serialize/_yaml.py: ``YAML()``, ``default_flow_style=False``)."""
    from ruamel.yaml import YAML

    yaml = YAML()
    yaml.default_flow_style = False
    return yaml


def _is_collection(value: Any) -> bool:
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    return isinstance(value, CommentedMap | CommentedSeq)


def _reattach_trailing_comment(mapping: Any, key: Any, indent: int) -> None:
    """A comment that ended the line of an inline value (``key: [...]  # why``) keeps the column it had
    after the inline value; once the value is a block it is put back two spaces after ``key:``."""
    entry = mapping.ca.items.get(key)
    if not entry or len(entry) < 3 or entry[2] is None or not entry[2].value.lstrip().startswith("#"):
        return
    text, newline, following = entry[2].value.strip().partition("\n")
    entry[2] = None
    mapping.yaml_add_eol_comment(text, key, column=indent + len(str(key)) + 3)
    if newline and following.strip():
        # Comment lines after the value: in block style they would belong to the value's last item, which
        # `dvc exp run -S` replaces (and drops); `--check` reports them, to be moved by hand.
        mapping.yaml_set_comment_before_after_key(key, after=following.strip().lstrip("#").strip())


def _to_dvc_layout(node: Any, indent: int = 0) -> None:
    """Block style for every mapping and list, recursively."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        node.fa.set_block_style()
        for key, value in node.items():
            if _is_collection(value) and value.fa.flow_style():
                _reattach_trailing_comment(node, key, indent)
            _to_dvc_layout(value, indent + 2)
    elif isinstance(node, CommentedSeq):
        node.fa.set_block_style()
        for value in node:
            _to_dvc_layout(value, indent + 2)


def dvc_set_params(text: str, overrides: list[str]) -> str:
    """What ``dvc exp run -S <override> ...`` writes for a params.yaml holding ``text`` (DVC's own function)."""
    import tempfile

    from dvc.utils.hydra import apply_overrides

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "params.yaml"
        path.write_text(text, encoding="utf-8")
        apply_overrides(path, overrides)
        return path.read_text(encoding="utf-8")


def dvc_round_trip(text: str) -> str:
    """What ``dvc exp run -S`` writes back when it sets ``profile`` to the value it already has."""
    yaml = _yaml()
    profile = yaml.load(text).get("profile")
    return dvc_set_params(text, [f"profile={profile}"])


def formatted(text: str) -> str:
    yaml = _yaml()
    data = yaml.load(text)
    _to_dvc_layout(data)
    stream = io.StringIO()
    yaml.dump(data, stream)
    return stream.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.params_format", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if DVC would re-lay-out params.yaml")
    parser.add_argument("path", nargs="?", default=None, help="default: the repository's params.yaml")
    args = parser.parse_args(argv)
    path = Path(args.path) if args.path else repo_root() / "params.yaml"
    text = path.read_text(encoding="utf-8")
    if args.check:
        if dvc_round_trip(text) != text:
            print(f"{path}: DVC would re-lay-out this file on `dvc exp run -S`: run `python -m flows.params_format`",
                  file=sys.stderr)
            return 1
        return 0
    new = formatted(text)
    if dvc_round_trip(new) != new:
        raise SystemExit(f"{path}: the formatted file is not a fixed point of DVC's dumper (a bug here)")
    path.write_text(new, encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
