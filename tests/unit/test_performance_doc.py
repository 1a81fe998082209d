"""docs/performance.md states the goals of the run bench/results.json records, as that run
judged them: a figure changes in both or in neither."""

import json
from pathlib import Path

from bench.report import GOALS_END, GOALS_START, goals_markdown, ours_peaks

REPO = Path(__file__).resolve().parents[2]


def test_the_performance_guide_shows_the_goals_of_the_recorded_run() -> None:
    doc = (REPO / "docs" / "performance.md").read_text(encoding="utf-8")
    results = json.loads((REPO / "bench" / "results.json").read_text(encoding="utf-8"))
    # One table, between one pair of markers: a stray marker would keep a stale copy around.
    assert (doc.count(GOALS_START), doc.count(GOALS_END)) == (1, 1)
    start, end = doc.index(GOALS_START), doc.index(GOALS_END) + len(GOALS_END)
    assert doc[start:end] == goals_markdown(results)
    assert results["meta"]["command"] in doc  # the run it cites


def test_the_memory_goal_takes_every_step_of_ours_and_no_baseline() -> None:
    results = {
        "scenarios": {
            "backfill": {
                "ours": {"ingest": {"driver_peak_mb": 700.0}},
                "duckdb_hourly": {"driver_peak_mb": 9e3},
            },
            "correction": {
                "cases": [{"readings": 100, "surface": {"publish": {"driver_peak_mb": 1500.0}}}],
                "lookback": {"driver_peak_mb": 8e3},
                "fold": {"tick_loop": {"driver_peak_mb": 2100.0}},
            },
        }
    }
    assert ours_peaks(results) == {
        "backfill/ours/ingest": 700.0,
        "correction/cases[100 readings]/surface/publish": 1500.0,
        "correction/fold/tick_loop": 2100.0,
    }
