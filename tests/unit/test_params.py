"""params.yaml validation: bad values fail with the key path, before any compute."""

from __future__ import annotations

import pytest
import yaml

from tasks.common.params import ParamsError, read_params, resolve_run, validate_params
from tests.conftest import REPO


def write_params(root, mutate):
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    mutate(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params))


def test_real_params_file_is_valid():
    validate_params(read_params(REPO / "params.yaml"))


def test_resolve_overrides_and_hash(output_root):
    spec = resolve_run("arm_ebm", "smoke", [3, 4])
    assert spec.profile == "smoke" and spec.seeds == (3, 4)
    assert spec.config.toy.vocab_size == 3
    assert spec.params_hash != resolve_run("arm_ebm", "smoke", [3, 5]).params_hash


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda p: p["arm_ebm"]["cpu"]["toy"].update(extra_knob=1), r"arm_ebm\.cpu\.toy\.extra_knob: unknown key"),
        (lambda p: p["arm_ebm"]["cpu"]["toy"].update(vocab_size="five"), r"arm_ebm\.cpu\.toy\.vocab_size: .*integer"),
        (lambda p: p["arm_ebm"]["cpu"]["gpt2"].update(n_layer=0),
         r"arm_ebm\.cpu\.gpt2\.n_layer: .*greater than or equal to 1"),
        (lambda p: p.update(profile="huge"), r"profile: must be one of smoke\|cpu\|paper, got 'huge'"),
        (lambda p: p["arm_ebm"].update(gpu={}), r"arm_ebm\.gpu: unknown profile"),
        (lambda p: p.update(seeds=[0, 0]), r"seeds: seeds must be distinct"),
        (lambda p: p.update(papers=["arm_ebm", "nosuch"]), r"papers\[1\]: unknown paper 'nosuch'"),
        (lambda p: p.update(typo_key=1), r"typo_key: unknown key"),
        (lambda p: p["arm_ebm"]["cpu"]["gpt2"].update(n_embd=33), r"arm_ebm\.cpu\.gpt2: .*divisible"),
        (lambda p: p["arm_ebm"].update(seeds={"cpu": [0, 0]}), r"arm_ebm\.seeds\.cpu: seeds must be distinct"),
        (lambda p: p["arm_ebm"].update(seeds={"gpu": [0]}), r"arm_ebm\.seeds\.gpu: unknown profile"),
        (lambda p: p["arm_ebm"].update(seeds=[0, 1]), r"arm_ebm\.seeds: must map a profile"),
        # JSON's strict types: a YAML boolean or a quoted number is no integer (lax pydantic read them as 1, 3)
        (lambda p: p["arm_ebm"]["cpu"]["gpt2"].update(steps=True), r"arm_ebm\.cpu\.gpt2\.steps: .*integer.*True"),
        (lambda p: p["arm_ebm"]["cpu"]["toy"].update(horizon="3"), r"arm_ebm\.cpu\.toy\.horizon: .*integer"),
        (lambda p: p["arm_ebm"]["cpu"]["gpt2"].update(lr="1e-3"), r"arm_ebm\.cpu\.gpt2\.lr: .*number"),
        (lambda p: p.update(seeds=[0, 2**64]), r"seeds\[1\]: must be an integer in \[0, 4294967295\]"),
        (lambda p: p["arm_ebm"].update(seeds={"cpu": [0, 1]}),
         r"arm_ebm\.seeds\.cpu: the cpu profile needs at least 3"),
        (lambda p: p.update(seeds=[0]), r"seeds: the cpu profile needs at least 3 seeds"),
        # a paper slug is a folder name of tasks/: a path in `papers` never reaches DVC or the file system
        (lambda p: p.update(papers=["arm_ebm", ".."]), r"papers\[1\]: unknown paper '\.\.'"),
        (lambda p: p.update(papers=["../x"]), r"papers\[0\]: unknown paper '\.\./x'"),
        (lambda p: p.update(papers=["../../x"]), r"papers\[0\]: unknown paper '\.\./\.\./x'"),
        # sizes without an upper bound of their own: refused before any compute, not when allocating
        (lambda p: p["arm_ebm"]["cpu"]["gpt2"].update(n_embd=1_000_000_000_000),
         r"arm_ebm\.cpu\.gpt2\.n_embd: 1000000000000 is beyond 10,000,000"),
        (lambda p: p["arm_ebm"]["cpu"]["bound"].update(horizons=[2, 3, 10**9]),
         r"arm_ebm\.cpu\.bound\.horizons\[2\]: 1000000000 is beyond"),
    ],
)
def test_bad_params_name_the_key(output_root, mutate, message):
    write_params(output_root, mutate)
    with pytest.raises(ParamsError, match=message):
        params = read_params()
        validate_params(params)
        resolve_run("arm_ebm")


def test_cli_overrides_are_validated(output_root):
    with pytest.raises(ParamsError, match=r"--profile: must be one of"):
        resolve_run("arm_ebm", "gpu")
    with pytest.raises(ParamsError, match=r"--seeds\[0\]: must be an integer in \[0, "):
        resolve_run("arm_ebm", "smoke", [-1])
    with pytest.raises(ParamsError, match=r"--seeds\[0\]: must be an integer in \[0, "):
        resolve_run("arm_ebm", "smoke", [99999999999999999999])
    with pytest.raises(ParamsError, match=r"--seeds: the cpu profile needs at least 3 seeds"):
        resolve_run("arm_ebm", "cpu", [0])
    with pytest.raises(ParamsError, match=r"paper: unknown paper 'nosuch'"):
        resolve_run("nosuch")


def test_a_paper_may_run_its_own_seeds_per_profile(output_root):
    write_params(output_root, lambda p: p["arm_ebm"].update(seeds={"smoke": [5, 6, 7, 8, 9]}))
    assert resolve_run("arm_ebm", "smoke").seeds == (5, 6, 7, 8, 9)
    assert resolve_run("arm_ebm", "smoke", [1]).seeds == (1,)  # the command line still wins
    top = tuple(read_params()["seeds"])
    assert resolve_run("arm_ebm", "paper").seeds == top  # other profiles keep the top-level seeds
