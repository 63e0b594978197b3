"""The paper contract's building blocks: code closures, typed seed results, the shared schedule,
and the contract loader's errors."""

from __future__ import annotations

import math

import pytest
import torch

from tasks.common import schedules
from tasks.common.codehash import code_closure, code_version, imported_modules
from tasks.common.contract import ContractError, load_paper
from tasks.common.results import SeedResult


def write(root, rel, text=""):
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


@pytest.fixture
def package(tmp_path):
    """tasks/p: train imports method and a common module (one lazily); evaluate imports only method."""
    write(tmp_path, "tasks/__init__.py")
    write(tmp_path, "tasks/common/__init__.py")
    write(tmp_path, "tasks/common/util.py", "import numpy\n")
    write(tmp_path, "tasks/common/other.py")
    write(tmp_path, "tasks/p/__init__.py")
    write(tmp_path, "tasks/p/method.py", "from . import helper\n")
    write(tmp_path, "tasks/p/helper.py")
    write(tmp_path, "tasks/p/train.py", "from tasks.p import method\n\ndef f():\n    from tasks.common import util\n")
    write(tmp_path, "tasks/p/evaluate.py", "from .method import something\n")
    write(tmp_path, "tasks/p/README.md", "not code")
    return tmp_path


def test_code_closure_is_exactly_the_imported_files(package):
    assert code_closure(["tasks.p.train"], package) == [
        "tasks/__init__.py", "tasks/common/__init__.py", "tasks/common/util.py", "tasks/p/__init__.py",
        "tasks/p/helper.py", "tasks/p/method.py", "tasks/p/train.py"]
    assert code_closure(["tasks.p.evaluate"], package) == [
        "tasks/__init__.py", "tasks/p/__init__.py", "tasks/p/evaluate.py", "tasks/p/helper.py", "tasks/p/method.py"]


def test_relative_imports_resolve(package):
    found = imported_modules(package / "tasks/p/evaluate.py", package)
    assert "tasks.p.method" in found and "tasks.p.method.something" in found


def test_code_version_changes_only_with_the_closure(package):
    train, evaluate = code_version(["tasks.p.train"], package), code_version(["tasks.p.evaluate"], package)
    write(package, "tasks/p/evaluate.py", "from .method import something\nX = 1\n")
    assert code_version(["tasks.p.train"], package) == train
    assert code_version(["tasks.p.evaluate"], package) != evaluate
    write(package, "tasks/p/README.md", "edited")
    write(package, "tasks/common/other.py", "Y = 2\n")
    assert code_version(["tasks.p.train"], package) == train
    write(package, "tasks/p/helper.py", "Z = 3\n")  # reached through method's relative import
    assert code_version(["tasks.p.train"], package) != train


def test_code_closure_names_a_missing_entry(package):
    with pytest.raises(ModuleNotFoundError, match="tasks.p.nosuch"):
        code_closure(["tasks.p.nosuch"], package)


def test_seed_result_add_stage_merge_and_round_trip():
    result = SeedResult(3).add({"a": 1}, b=True, curves={"loss": [3, 2]}, tables={"t": [{"x": 1}]})
    assert result.metrics == {"a": 1.0, "b": 1.0} and result.curves == {"loss": [3.0, 2.0]}
    with result.stage("fit"):
        pass
    assert result.metrics["seconds_fit"] >= 0
    with pytest.raises(KeyError, match="'a'"):
        result.add(a=2)
    with pytest.raises(TypeError, match="'c' must be a number"):
        result.add(c="high")
    merged = result.merged(SeedResult(3).add(d=4.0))
    assert merged.metrics["d"] == 4.0 and "d" not in result.metrics
    with pytest.raises(ValueError, match="seeds 3 and 4"):
        result.merged(SeedResult(4))
    assert SeedResult.from_dict(merged.to_dict()) == merged
    assert math.isnan(SeedResult(0).add(n=float("nan")).metrics["n"])


def factor_check() -> bool:
    """warm-up 4 of 100 steps: step 0 -> 1/4 * 1; step 1 -> 2/4 * 0.5 (1 + cos(pi/100)); step 50 -> 0.5."""
    f = schedules.warmup_cosine_factor
    expected = [0.25, 0.5 * 0.5 * (1 + math.cos(math.pi / 100)), 0.5]
    return all(math.isclose(f(s, 100, 4), e, rel_tol=0, abs_tol=1e-15) for s, e in zip((0, 1, 50), expected))


def test_warmup_cosine_exact_values():
    assert factor_check()
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=2.0)
    schedule = schedules.warmup_cosine(optimizer, 100, 4)
    lrs = []
    for _ in range(3):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert lrs == [2.0 * schedules.warmup_cosine_factor(s, 100, 4) for s in range(3)]


def test_negative_control_schedule_without_warmup_is_caught(monkeypatch):
    monkeypatch.setattr(schedules, "warmup_cosine_factor",
                        lambda s, total, warm: 0.5 * (1 + math.cos(math.pi * s / total)))
    assert not factor_check()


def test_contract_loader_names_the_missing_piece(package, monkeypatch):
    import sys

    monkeypatch.syspath_prepend(str(package))
    for name in [m for m in sys.modules if m == "tasks" or m.startswith("tasks.")]:
        monkeypatch.delitem(sys.modules, name)
    with pytest.raises(ContractError, match=r"tasks/p/data\.py is missing"):
        load_paper("p")
    write(package, "tasks/p/data.py", "write_data = None\n")
    with pytest.raises(ContractError, match=r"tasks/p/data\.py must define write_data"):
        load_paper("p")
