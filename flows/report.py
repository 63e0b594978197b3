"""The ``report`` DVC stage: reports/*/claims.json -> reports/index.md and reports/index.html."""

from __future__ import annotations

import sys

from flows.registry import papers
from tasks.common.params import ParamsError
from tasks.common.report import build_index


def main() -> int:
    try:
        slugs = papers()
    except ParamsError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    md, html = build_index(slugs)
    print(f"report: {md}\n        {html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
