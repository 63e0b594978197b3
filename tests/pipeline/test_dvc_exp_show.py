"""`dvc exp show` on 19 papers (issue 22): the README's command line gives a narrow table of what changed,
where the plain table is a squeezed grid of thousands of columns. Run on a copy of the repository with the
committed headline metrics and one param changed (what a user sees before and after `dvc exp run -S`)."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tests.pipeline.helpers import BIN, copy_repository, project_env

CHANGED = "arm_ebm.smoke.toy.horizon"
# The README's line in its "Running one paper" block: `dvc exp show ...   # comment`.
README_LINE = re.compile(r"^(dvc exp show [^#\n]*?)\s+#", re.MULTILINE)


def width(text: str) -> int:
    return max((len(line) for line in text.splitlines()), default=0)


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    dest = tmp_path_factory.mktemp("exp-show") / "repo"
    dest.mkdir()
    copy_repository(dest)
    for headline in REPO.glob("reports/*/headline.json"):  # the metrics of the committed results
        target = dest / headline.relative_to(REPO)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(headline, target)
    subprocess.run("git add -A && git -c user.email=t@t -c user.name=t commit -qm metrics", shell=True, cwd=dest,
                   check=True)
    params = dest / "params.yaml"
    text = params.read_text()
    changed = re.sub(r"(\n  smoke:\n    toy:\n      vocab_size: 3\n      horizon: )4\n", r"\g<1>5\n", text, count=1)
    assert changed != text, "params.yaml no longer has arm_ebm's smoke toy horizon 4 where the test expects it"
    params.write_text(changed)
    env = project_env(dest, DVC_NO_ANALYTICS="1")
    env.pop("REPRO_ROOT")
    return dest, env


def dvc(repo, env, *args: str) -> str:
    """Piped, so DVC renders the whole table (up to its 1024-character cap) as its pager would get it."""
    result = subprocess.run([str(BIN / "dvc"), *args], cwd=repo, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def test_the_readme_command_shows_only_what_changed(repo):
    dest, env = repo
    command = shlex.split(README_LINE.search((REPO / "README.md").read_text()).group(1))
    assert command[:3] == ["dvc", "exp", "show"] and "--only-changed" in command
    table = dvc(dest, env, *command[1:])
    assert CHANGED in table and re.search(r"workspace\s.*\s5\s", table) and re.search(r"master\s.*\s4\s", table)
    assert width(table) <= 60, table  # measured 51: Experiment, Created, the changed param
    markdown = dvc(dest, env, *command[1:], "--md")
    assert f"| {CHANGED}" in markdown and width(markdown) <= 70, markdown
    kept = dvc(dest, env, *command[1:], "--keep", "^profile$")
    assert re.search(r"\bprofile\b", kept) and width(kept) <= 80, kept
    diff = dvc(dest, env, "params", "diff")
    assert CHANGED in diff and width(diff) <= 80, diff


def test_the_plain_table_is_why_the_readme_filters(repo):
    """Negative control: without the filter DVC fits ~2450 columns into its width by hiding nearly all of them,
    the changed param among them (measured: 7 columns, 220 characters)."""
    dest, env = repo
    table = dvc(dest, env, "exp", "show")
    assert width(table) > 150 and CHANGED not in table, table[:3000]
