"""No value of params.yaml can make DVC touch a path outside data/, models/ and reports/ (issue 21): DVC's
stages are generated from known paper folders, never interpolated from the free-form ``papers`` list (with
``foreach: ${papers}``, ``dvc repro -s 'data@../../x'`` deleted a folder outside the repository)."""

from __future__ import annotations

import pytest
import yaml

from flows import dvc_yaml
from tests.conftest import REPO


def test_the_committed_dvc_yaml_interpolates_nothing_from_params():
    text = (REPO / "dvc.yaml").read_text()
    assert "${" not in text and "foreach" not in text
    outs = []
    for stage in yaml.safe_load(text)["stages"].values():
        for out in stage.get("outs", []) + stage.get("metrics", []) + stage.get("plots", []):
            outs.extend(out if isinstance(out, dict) else [out])
    assert outs and all(o.split("/")[0] in ("data", "models", "reports") and ".." not in o.split("/") for o in outs)


@pytest.mark.parametrize("entry", ["..", "../x", "../../x", "arm_ebm/../.."])
def test_the_generator_refuses_a_papers_entry_that_is_not_a_paper_folder(entry):
    with pytest.raises(ValueError, match=r"papers: unknown paper\(s\)"):
        dvc_yaml.render(["arm_ebm", entry])


def test_the_generator_writes_nothing_for_a_path_in_papers(output_root):
    """``python -m flows.dvc_yaml`` validates params.yaml first: a path in ``papers`` is named, dvc.yaml untouched."""
    params = yaml.safe_load((output_root / "params.yaml").read_text())
    params["papers"] = ["arm_ebm", "../x"]
    (output_root / "params.yaml").write_text(yaml.safe_dump(params))
    from tasks.common.params import ParamsError

    with pytest.raises((ParamsError, ValueError), match=r"\.\./x"):
        dvc_yaml.main([])
    assert not (output_root / "dvc.yaml").exists()
