"""params.yaml is laid out as `dvc exp run -S` writes it, so an override changes only its own lines
(flows/params_format.py; the overrides go through DVC's own ``apply_overrides``)."""

from __future__ import annotations

import difflib

import yaml

from flows.params_format import dvc_round_trip, dvc_set_params, formatted
from tests.conftest import REPO


def changed_lines(before: str, after: str) -> list[str]:
    return [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
            if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def test_committed_params_are_dvcs_fixed_point():
    text = (REPO / "params.yaml").read_text()
    assert dvc_round_trip(text) == text, "run `python -m flows.params_format`"


def test_set_param_changes_only_its_own_lines():
    text = (REPO / "params.yaml").read_text()
    after = dvc_set_params(text, ["profile=smoke", "arm_ebm.cpu.gpt2.lr=5e-4"])
    assert sorted(changed_lines(text, after)) == [
        "+      lr: 0.0005", "+profile: smoke          # smoke | cpu | paper",
        "-      lr: 1.0e-3", "-profile: cpu            # smoke | cpu | paper"]
    assert yaml.safe_load(after)["arm_ebm"]["cpu"]["gpt2"]["lr"] == 5e-4


INLINE = """\
profile: cpu  # smoke | cpu
seeds: [0, 1, 2]        # at least 3
demo:
  cpu:
    model: {n_layer: 3, n_head: 4, n_embd: 64, steps: 5000, batch_size: 64, lr: 1.0e-3, warmup_steps: 100}
    grid: [[1, 0.5], [2, 0.25]]
"""


def test_the_inline_layout_is_rewritten_by_dvc_and_formatting_fixes_it():
    # Negative control: the layout params.yaml used to have is re-laid-out by a no-op override.
    assert len(changed_lines(INLINE, dvc_round_trip(INLINE))) > 4
    fixed = formatted(INLINE)
    assert yaml.safe_load(fixed) == yaml.safe_load(INLINE)
    assert dvc_round_trip(fixed) == fixed
    assert "seeds:  # at least 3\n- 0\n" in fixed and "profile: cpu  # smoke | cpu" in fixed
    assert changed_lines(fixed, dvc_set_params(fixed, ["demo.cpu.model.steps=10"])) == [
        "-      steps: 5000", "+      steps: 10"]
