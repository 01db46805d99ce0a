"""This directory's runs as tables (`.venv/bin/python reports/routing-s9/drift/summarize.py > ...`): the same section
per run as reports/routing-s8/summarize.py (command, uptime before and after, medians over the seeds with ranges,
eng = the engines' own TTFT, issue 15's verdicts for `default` against the peers of the same run), reused here."""

from __future__ import annotations

import importlib.util
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = {"a-drift40": "drift", "a-zipf40": "zipf", "f-drift40": "drift", "f-zipf40": "zipf",
        "f-uniform80": "uniform", "f-zipf80": "zipf", "f-drift80": "drift"}


def main() -> None:
    spec = importlib.util.spec_from_file_location("s8_summarize", HERE.parents[1] / "routing-s8" / "summarize.py")
    assert spec is not None and spec.loader is not None
    s8 = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(s8)
    s8.HERE, s8.RUNS = HERE, RUNS
    s8.main()


if __name__ == "__main__":
    main()
