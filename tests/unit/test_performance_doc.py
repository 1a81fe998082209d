"""docs/performance.md states the goals of the run bench/results.json records, as that run
judged them: a figure changes in both or in neither."""

import json
from pathlib import Path

from bench.report import GOALS_END, GOALS_START, goals_markdown

REPO = Path(__file__).resolve().parents[2]


def test_the_performance_guide_shows_the_goals_of_the_recorded_run() -> None:
    doc = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    results = json.loads((REPO / "bench" / "results.json").read_text(encoding="utf-8"))
    start, end = doc.index(GOALS_START), doc.index(GOALS_END) + len(GOALS_END)
    assert doc[start:end] == goals_markdown(results)
    assert results["meta"]["command"] in doc  # the run it cites
