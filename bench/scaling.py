"""Scenario 4, scaling: the one-reading correction on archives of D days (same meters, same end),
each freshly ingested and backfilled; its cost must not grow with D."""

import shutil

from bench.backfill import ingest_and_backfill
from bench.context import Bench
from bench.correction import one_reading_repeats
from bench.generate import write_dataset
from bench.harness import BenchWorld
from bench.metrics import say


def scaling_point(bench: Bench, days: int) -> dict:
    root = bench.work / f"scale-{days}d"
    say(f"scaling: archive of {bench.meters} meters x {days} days")
    dataset = write_dataset(root / "data", bench.meters, days, seed=bench.seed)
    try:
        with BenchWorld.create(root) as world:
            ingest_and_backfill(bench, world, dataset)
            case = one_reading_repeats(bench, world, dataset, seed=bench.seed + days)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    case.pop("_changes")
    return point(days, dataset.rows, case)


def point(days: int, rows: int, case: dict) -> dict:
    return {
        "days": days,
        "raw_rows": rows,
        "median_commit_to_last_level_s": case["median_commit_to_last_level_s"],
        "median_tick_loop_s": case["median_tick_loop_s"],
        "rows_read": case["rows_read"],
        "windows_recomputed": case["windows_recomputed"],
        "repeats": case["repeats"],
    }


def run_scaling(bench: Bench, main_case: dict, main_rows: int) -> dict:
    """`main_case` is the main archive's one-reading case (the largest D); the others are built
    here. Returns the points and the ratio of the largest D's median to the smallest D's."""
    points = []
    for days in bench.scaling_days:
        if days == bench.days:
            points.append(point(days, main_rows, main_case))
        else:
            points.append(scaling_point(bench, days))
    points.sort(key=lambda p: p["days"])
    lo, hi = points[0], points[-1]
    key = "median_commit_to_last_level_s"
    ratio = hi[key] / lo[key] if lo[key] else float("nan")
    return {"points": points, "ratio_largest_to_smallest": round(ratio, 3)}
