"""Atomic writes and source hashing."""

from __future__ import annotations

import os
import stat

import pytest

from tasks.common import io
from tasks.common.io import atomic_path, read_json, write_json
from tasks.common.provenance import hash_files


def test_atomic_write_replaces_whole_file(tmp_path):
    target = tmp_path / "out" / "m.json"
    write_json(target, {"a": 1})
    assert read_json(target) == {"a": 1}
    write_json(target, {"a": 2})
    assert read_json(target) == {"a": 2}
    assert [p.name for p in target.parent.iterdir()] == ["m.json"]


def test_failed_write_leaves_old_file_and_no_partial(tmp_path):
    target = tmp_path / "m.json"
    write_json(target, {"a": 1})
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text('{"a": ')  # half-written content, then the writer dies
            raise RuntimeError("killed")
    assert read_json(target) == {"a": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.json"]


def test_hash_files_tracks_content_and_names(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("x = 1\n")
    first = hash_files(["a.py"], tmp_path)
    assert hash_files(["a.py"], tmp_path) == first
    assert hash_files(["b.py"], tmp_path) != first  # same content, other file
    (tmp_path / "a.py").write_text("x = 2\n")
    assert hash_files(["a.py"], tmp_path) != first


def test_write_dir_with_replaces_atomically(tmp_path):
    from tasks.common.io import write_dir_with

    target = tmp_path / "model"
    write_dir_with(target, lambda d: (d / "a.txt").write_text("one"))
    write_dir_with(target, lambda d: (d / "b.txt").write_text("two"))
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]

    def broken(d):
        (d / "half.txt").write_text("half")
        raise RuntimeError("killed mid-write")

    with pytest.raises(RuntimeError):
        write_dir_with(target, broken)
    assert sorted(p.name for p in target.iterdir()) == ["b.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_state_dict_round_trip(tmp_path):
    import torch

    from tasks.common.io import load_state_dict, save_state_dict

    source = torch.nn.Linear(3, 2)
    path = save_state_dict(source, tmp_path / "w.safetensors")
    target = torch.nn.Linear(3, 2)
    assert not torch.equal(source.weight, target.weight)
    load_state_dict(target, path)
    assert torch.equal(source.weight, target.weight) and torch.equal(source.bias, target.bias)
    with pytest.raises(RuntimeError):
        load_state_dict(torch.nn.Linear(3, 4), path)


def test_remove_partials_clears_only_temp_siblings(tmp_path):
    from tasks.common.io import remove_partials

    (tmp_path / "seed0").mkdir()
    keep = [tmp_path / "seed0" / "result.json", tmp_path / "final.partial"]  # not a temp sibling name
    for path in keep:
        path.write_text("{}")
    stale_file = tmp_path / "seed0" / ".result.json.ab12cd.partial"
    stale_file.write_text("{half")
    stale_dir = tmp_path / ".gpt2_arm.xy34.partial"
    stale_dir.mkdir()
    (stale_dir / "model.safetensors").write_bytes(b"half")
    removed = remove_partials(tmp_path)
    assert sorted(removed) == sorted([stale_file, stale_dir])
    assert all(p.exists() for p in keep) and not stale_file.exists() and not stale_dir.exists()
    assert remove_partials(tmp_path / "missing") == []


@pytest.mark.parametrize("umask", [0o022, 0o077])
def test_outputs_respect_the_umask(tmp_path, umask):
    """mkstemp alone gives 0600: a teammate or a web server could not read the reports (issue 21)."""
    previous = os.umask(umask)
    try:
        file = io.write_text(tmp_path / "claims.md", "x")
        folder = io.write_dir_with(tmp_path / "model", lambda d: (d / "w.bin").write_bytes(b"0"))
    finally:
        os.umask(previous)
    assert stat.S_IMODE(file.stat().st_mode) == 0o666 & ~umask
    assert stat.S_IMODE(folder.stat().st_mode) == 0o777 & ~umask
