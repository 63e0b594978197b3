"""Every paper in params.yaml against the paper contract (docs/adding_a_paper.md), in one place:
its profiles validate, a bad value fails naming the key, its step modules exist and define their
functions, and flows/<slug>.py is the template's boilerplate."""

from __future__ import annotations

import re

import pytest
import yaml

from tasks.common.contract import load_paper
from tasks.common.params import ParamsError, validate_paper_section
from tests.conftest import REPO

PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())
PAPERS = PARAMS["papers"]


def first_number(section: dict, path: tuple[str, ...] = ()) -> tuple[str, ...] | None:
    """Key path of the first integer or float leaf (not a bool) of a nested mapping."""
    for key, value in section.items():
        if isinstance(value, dict):
            found = first_number(value, (*path, key))
            if found:
                return found
        elif isinstance(value, int | float) and not isinstance(value, bool):
            return (*path, key)
    return None


@pytest.mark.parametrize("slug", PAPERS)
def test_profiles_validate(slug):
    configs = validate_paper_section(slug, PARAMS[slug])
    assert set(configs) == {"smoke", "cpu", "paper"}
    assert all(getattr(c, "device", None) in ("auto", "cpu", "cuda", "mps") for c in configs.values())


@pytest.mark.parametrize("slug", PAPERS)
def test_a_bad_value_names_its_key(slug):
    section = yaml.safe_load(yaml.safe_dump(PARAMS[slug]))
    path = first_number(section["cpu"])
    assert path, f"{slug}.cpu has no numeric knob"
    leaf = section["cpu"]
    for key in path[:-1]:
        leaf = leaf[key]
    leaf[path[-1]] = "not a number"
    key = re.escape(".".join((slug, "cpu", *path)))
    with pytest.raises(ParamsError, match=rf"^{key}: "):
        validate_paper_section(slug, section)
    section = yaml.safe_load(yaml.safe_dump(PARAMS[slug]))
    section["cpu"]["no_such_knob"] = 1
    with pytest.raises(ParamsError, match=rf"^{slug}\.cpu\.no_such_knob: unknown key"):
        validate_paper_section(slug, section)


@pytest.mark.parametrize("slug", PAPERS)
def test_steps_and_flow_follow_the_template(slug):
    paper = load_paper(slug)
    assert paper.title.startswith(slug)
    template = (REPO / "templates" / "new_paper" / "flow.py").read_text().replace("new_paper", slug)
    assert (REPO / "flows" / f"{slug}.py").read_text() == template, "flows/<slug>.py is the template's boilerplate"
    for name in ("method.py",):
        text = (REPO / "tasks" / slug / name).read_text()
        assert "import prefect" not in text and "import mlflow" not in text, f"{name} must stay a pure library"
