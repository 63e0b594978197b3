"""The global claimed-vs-reproduced table: ``reports/index.md`` and ``reports/index.html``.

Only empirical claims are counted as reproduced (mechanism checks have their own column);
identities and references are verified by unit tests and shown in a separate verification count.
"""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.common.claims import (
    REPORT_ONLY,
    UNIT_TESTED,
    VERDICTS,
    VERIFICATION_FAILED,
    VERIFICATION_KINDS,
    VERIFIED,
    claims_markdown,
    format_number,
    format_ours,
    format_seeds_needed,
    is_counted,
)
from tasks.common.env import repo_root
from tasks.common.io import read_json, write_text

RULE = ("Verdict rule: a 95% interval that fits the metric (t-interval on the mean over seeds; Clopper-Pearson "
        "on pooled counts for rates; the t-interval on the log, exponentiated, for ratios) must lie entirely "
        "inside the check to be `reproduced`, entirely outside for `not reproduced`; otherwise `inconclusive`, "
        "with the seeds the observed mean and spread would need to decide. `undecided`: a precondition of the "
        "test bed, stated before the run, was not met. Only `empirical` claims count as reproduced; "
        "`mechanism` checks (of the project's own reconstruction) are counted apart; identities and "
        "references are verified by unit tests and never counted; `report only` rows show numbers without a check.")


def collect_rows(reports_dir: Path, papers: list[str]) -> dict[str, list[dict[str, Any]]]:
    rows = {}
    for slug in papers:
        path = reports_dir / slug / "claims.json"
        rows[slug] = read_json(path) if path.exists() else []
    return rows


def verdict_counts(rows: list[dict[str, Any]], kind: str | tuple[str, ...] = "empirical") -> Counter:
    kinds = (kind,) if isinstance(kind, str) else kind
    return Counter(r["verdict"] for r in rows if r.get("kind", "empirical") in kinds)


SUMMARY_COLUMNS = ("paper", "profile", "empirical claims", *VERDICTS, "mechanism (reproduced / all)",
                   "identities and references", "report only")


def _summary_cells(rows: list[dict[str, Any]]) -> list[str]:
    empirical = verdict_counts(rows)
    mechanism = verdict_counts(rows, "mechanism")
    report_only = empirical.pop(REPORT_ONLY, 0) + mechanism.pop(REPORT_ONLY, 0)
    verification = Counter(r["verdict"] for r in rows if r.get("kind") in VERIFICATION_KINDS)
    checked = (f"{verification.get(VERIFIED, 0)} at run time + {verification.get(UNIT_TESTED, 0)} by unit test, "
               f"{verification.get(VERIFICATION_FAILED, 0)} failed")
    return ([str(sum(empirical.values()))] + [str(empirical.get(v, 0)) for v in VERDICTS]
            + [f"{mechanism.get('reproduced', 0)} / {sum(mechanism.values())}",
               checked, str(report_only)])


def build_index(papers: list[str], reports_dir: Path | None = None) -> tuple[Path, Path]:
    reports_dir = reports_dir or repo_root() / "reports"
    by_paper = collect_rows(reports_dir, papers)
    all_rows = [row for rows in by_paper.values() for row in rows]
    counted = [r for r in all_rows if is_counted(r)]
    md = ["# Claimed vs reproduced", "", RULE, "",
          "| " + " | ".join(SUMMARY_COLUMNS) + " |", "|" + "---|" * len(SUMMARY_COLUMNS)]
    for slug, rows in by_paper.items():
        profile = rows[0]["profile"] if rows else "not run"
        md.append(f"| [{slug}]({slug}/claims.md) | {profile} | " + " | ".join(_summary_cells(rows)) + " |")
    # Counts are summed within a profile only: smoke and cpu verdicts are different experiments.
    by_profile: dict[str, list[dict[str, Any]]] = {}
    for row in all_rows:
        by_profile.setdefault(row["profile"], []).append(row)
    for profile, rows in sorted(by_profile.items()) or [("", [])]:
        md.append(f"| **all** | {profile} | " + " | ".join(_summary_cells(rows)) + " |")
    if len(by_profile) > 1:
        md += ["", f"The papers were last run at different profiles ({', '.join(sorted(by_profile))}); each "
                   "profile has its own total. `dvc repro` runs every paper at the profile of params.yaml."]
    md += ["", "## Every empirical and mechanism claim", "",
           claims_markdown(counted, with_paper=True) if counted else "(no runs yet)"]
    md_path = write_text(reports_dir / "index.md", "\n".join(md) + "\n")
    html_path = write_text(reports_dir / "index.html", _html(by_paper, reports_dir))
    return md_path, html_path


def _html_row(r: dict[str, Any]) -> str:
    css = {"reproduced": "reproduced", "verified": "reproduced", "not reproduced": "not",
           "verification failed": "not", "inconclusive": "inconclusive", "undecided": "inconclusive"}.get(
        r["verdict"], "")
    check = f"{r['metric']} {r['check']}" if r["metric"] else "-"
    paper_value = r["paper_value"] if not isinstance(r["paper_value"], float) else format_number(r["paper_value"])
    cells = [r["id"], r.get("kind", "empirical"), r["claim"], str(paper_value), check, format_ours(r),
             r["verdict"], format_seeds_needed(r), r["fidelity"]]
    return f"<tr class='{css}'>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"


def _html_summary(by_paper: dict[str, list[dict[str, Any]]]) -> list[str]:
    """The per-paper counts at the top of the page, as in index.md, each paper linked to its section and
    its claims.md."""
    parts = ["<table class='summary'><tr>" + "".join(f"<th>{html.escape(h)}</th>" for h in SUMMARY_COLUMNS)
             + "</tr>"]
    for slug, rows in by_paper.items():
        profile = rows[0]["profile"] if rows else "not run"
        name = (f"<a href='#{html.escape(slug)}'>{html.escape(slug)}</a> "
                f"(<a href='{html.escape(slug)}/claims.md'>claims.md</a>)")
        parts.append(f"<tr><td>{name}</td><td>{html.escape(profile)}</td>"
                     + "".join(f"<td>{html.escape(c)}</td>" for c in _summary_cells(rows)) + "</tr>")
    parts.append("</table>")
    return parts


def _html_figures(slug: str, reports_dir: Path) -> list[str]:
    figures = sorted((reports_dir / slug / "figures").glob("*.png"))
    if not figures:
        return [f"<p class='note'>No figures here: they are outputs of the <code>evaluate-{html.escape(slug)}</code> "
                f"stage, which has not run in this checkout (<code>dvc repro evaluate-{html.escape(slug)}</code>, "
                "or <code>dvc pull</code> from a shared remote).</p>"]
    return ["<div class='figures'>"] + [
        f"<figure><img src='{html.escape(slug)}/figures/{html.escape(f.name)}' alt='{html.escape(f.stem)}'>"
        f"<figcaption>{html.escape(f.name)}</figcaption></figure>" for f in figures] + ["</div>"]


def _html(by_paper: dict[str, list[dict[str, Any]]], reports_dir: Path) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Claimed vs reproduced</title>",
             "<style>body{font-family:sans-serif;max-width:1200px;margin:auto;padding:0 12px}"
             "table{border-collapse:collapse;margin-bottom:12px}"
             "td,th{border:1px solid #ccc;padding:4px 6px;font-size:13px}"
             ".summary td,.summary th{text-align:right}.summary td:first-child{text-align:left}"
             # Figures one per row at up to the page width: matplotlib's panels stay legible.
             "figure{margin:12px 0}figure img{max-width:100%;height:auto;border:1px solid #eee}"
             "figcaption{font-size:12px;color:#555}.note{color:#8a5a00}"
             ".reproduced{background:#e3f4e1}.not{background:#f9dcdc}.inconclusive{background:#fdf3d7}</style>",
             "</head><body><h1>Claimed vs reproduced</h1>", *_html_summary(by_paper),
             f"<p>{html.escape(RULE)}</p>"]
    header = "".join(f"<th>{h}</th>" for h in ("id", "kind", "claim", "paper's value", "check", "ours (mean [95% CI])",
                                                "verdict", "seeds needed", "fidelity"))
    for slug, rows in by_paper.items():
        parts.append(f"<h2 id='{html.escape(slug)}'>{html.escape(slug)}</h2>")
        if not rows:
            parts.append("<p>not run yet</p>")
            continue
        parts.append(f"<table><tr>{header}</tr>")
        parts += [_html_row(r) for r in sorted(rows, key=lambda r: not is_counted(r))]
        parts.append("</table>")
        parts += _html_figures(slug, reports_dir)
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
