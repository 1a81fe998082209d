"""Scenario 4, width and length: the same 100-reading wave on a narrow and a wide archive
(M and 10 M meters, the shortest scaling days) and on a short and a long one (M meters, the
shortest scaling days and the main archive's). What the wave costs, ingest, correction and
publish together (rows read, bytes written, seconds), must not grow with the archive."""

import shutil

from bench.backfill import ingest_and_backfill
from bench.context import Bench
from bench.correction import correct
from bench.generate import write_dataset
from bench.harness import BenchWorld
from bench.metrics import say

WAVE = 100
FIGURES = ("rows_read", "bytes_written", "seconds")


def wave_point(bench: Bench, meters: int, days: int) -> dict:
    """A fresh archive of `meters` x `days`, backfilled, then the wave."""
    root = bench.work / f"wave-{meters}m-{days}d"
    say(f"width and length: archive of {meters:,} meters x {days} days")
    dataset = write_dataset(root / "data", meters, days, seed=bench.seed)
    try:
        with BenchWorld.create(root) as world:
            ingest_and_backfill(bench, world, dataset)
            case = correct(bench, world, dataset, WAVE, seed=bench.seed + days, with_reads=False)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    case.pop("_changes")
    return point(meters, days, dataset.rows, case)


def point(meters: int, days: int, rows: int, case: dict) -> dict:
    return {
        "meters": meters,
        "days": days,
        "raw_rows": rows,
        "rows_read": case["whole_wave"]["rows_read"],
        "bytes_written": case["bytes_written"]["total"]["bytes"],
        "seconds": case["whole_wave"]["seconds"],
        "steps": {
            "ingest_s": case["ingest"]["seconds"],
            "correction_s": case["tick_loop"]["seconds"],
            "publish_s": case["surface"]["publish"]["seconds"],
            "bytes_written": {k: v["bytes"] for k, v in case["bytes_written"].items()},
        },
    }


def ratios(small: dict, large: dict) -> dict[str, float]:
    return {k: round(large[k] / small[k], 3) if small[k] else float("nan") for k in FIGURES}


def run_scaling(bench: Bench, main_case: dict, main_rows: int) -> dict:
    """`main_case` is the main archive's 100-reading case (the long archive); the short and the
    wide archives are built here, one at a time."""
    short_days = min(bench.scaling_days)
    base = wave_point(bench, bench.meters, short_days)
    wide = wave_point(bench, 10 * bench.meters, short_days)
    long = point(bench.meters, bench.days, main_rows, main_case)
    return {
        "wave": WAVE,
        "points": [base, wide, long],
        "width": {"from": base["meters"], "to": wide["meters"], **ratios(base, wide)},
        "length": {"from": base["days"], "to": long["days"], **ratios(base, long)},
    }
