"""The global claimed-vs-reproduced table: ``reports/index.md`` and ``reports/index.html``."""

from __future__ import annotations

import html
from collections import Counter
from pathlib import Path
from typing import Any

from tasks.common.claims import VERDICTS, claims_markdown, format_number, format_ours
from tasks.common.env import repo_root
from tasks.common.io import read_json, write_text


def collect_rows(reports_dir: Path, papers: list[str]) -> dict[str, list[dict[str, Any]]]:
    rows = {}
    for slug in papers:
        path = reports_dir / slug / "claims.json"
        rows[slug] = read_json(path) if path.exists() else []
    return rows


def verdict_counts(rows: list[dict[str, Any]]) -> Counter:
    return Counter(r["verdict"] for r in rows)


def build_index(papers: list[str], reports_dir: Path | None = None) -> tuple[Path, Path]:
    reports_dir = reports_dir or repo_root() / "reports"
    by_paper = collect_rows(reports_dir, papers)
    all_rows = [row for rows in by_paper.values() for row in rows]
    totals = verdict_counts(all_rows)
    md = ["# Claimed vs reproduced", "",
          "Verdict rule: the 95% interval over seeds (t-interval below 5 seeds, bootstrap from 5) must lie "
          "entirely inside the check to be `reproduced`, entirely outside for `not reproduced`; otherwise "
          "`inconclusive`.", "",
          "| paper | profile | claims | " + " | ".join(VERDICTS) + " |",
          "|---|---|---|" + "---|" * len(VERDICTS)]
    for slug, rows in by_paper.items():
        counts = verdict_counts(rows)
        profile = rows[0]["profile"] if rows else "not run"
        md.append(f"| [{slug}]({slug}/claims.md) | {profile} | {len(rows)} | "
                  + " | ".join(str(counts.get(v, 0)) for v in VERDICTS) + " |")
    md.append(f"| **all** | | {len(all_rows)} | " + " | ".join(str(totals.get(v, 0)) for v in VERDICTS) + " |")
    md += ["", "## Every claim", "", claims_markdown(all_rows, with_paper=True) if all_rows else "(no runs yet)"]
    md_path = write_text(reports_dir / "index.md", "\n".join(md) + "\n")
    html_path = write_text(reports_dir / "index.html", _html(by_paper, reports_dir))
    return md_path, html_path


def _html(by_paper: dict[str, list[dict[str, Any]]], reports_dir: Path) -> str:
    parts = ["<!doctype html><html><head><meta charset='utf-8'><title>Claimed vs reproduced</title>",
             "<style>body{font-family:sans-serif;max-width:1100px;margin:auto}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:4px 6px;font-size:13px}img{max-width:48%;margin:4px}"
             ".reproduced{background:#e3f4e1}.not{background:#f9dcdc}.inconclusive{background:#fdf3d7}</style>",
             "</head><body><h1>Claimed vs reproduced</h1>"]
    for slug, rows in by_paper.items():
        parts.append(f"<h2>{html.escape(slug)}</h2>")
        if not rows:
            parts.append("<p>not run yet</p>")
            continue
        parts.append("<table><tr><th>id</th><th>claim</th><th>paper</th><th>check</th>"
                     "<th>ours (mean [95% CI])</th><th>verdict</th><th>fidelity</th></tr>")
        for r in rows:
            css = {"reproduced": "reproduced", "not reproduced": "not", "inconclusive": "inconclusive"}.get(
                r["verdict"], "")
            check = f"{r['metric']} {r['check']}" if r["metric"] else "-"
            paper_value = r["paper_value"] if not isinstance(r["paper_value"], float) else format_number(
                r["paper_value"])
            parts.append(f"<tr class='{css}'><td>{r['id']}</td><td>{html.escape(r['claim'])}</td>"
                         f"<td>{html.escape(str(paper_value))}</td><td>{html.escape(check)}</td>"
                         f"<td>{html.escape(format_ours(r))}</td><td>{r['verdict']}</td>"
                         f"<td>{r['fidelity']}</td></tr>")
        parts.append("</table>")
        for fig in sorted((reports_dir / slug / "figures").glob("*.png")):
            parts.append(f"<img src='{slug}/figures/{fig.name}' alt='{fig.stem}'>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"
