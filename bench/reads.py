"""Scenario 3, reads: the generation-resolving read path (`query_arrow`) against a plain
delta-rs read of the same rollup table and time range (which sees every stored generation)."""

import time
from collections.abc import Callable
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from bench.context import Bench
from bench.generate import PERIOD_END
from bench.harness import BenchWorld
from bench.metrics import median, say
from rollup_assets.services.query import query_arrow

TS = pa.timestamp("us", tz="UTC")


def plain_read(world: BenchWorld, rollup: str, start: datetime, end: datetime) -> pa.Table:
    """What a user gets from delta-rs directly: rows with bucket_start in [start, end)."""
    table = DeltaTable(world.engine.rollups.uri(world.catalog.rollup(rollup)))
    start_s, end_s = pa.scalar(start, TS), pa.scalar(end, TS)
    cond = (ds.field("bucket_start") >= start_s) & (ds.field("bucket_start") < end_s)
    return table.to_pyarrow_dataset().to_table(filter=cond)


def _timed(read: Callable[[], pa.Table], repeats: int) -> tuple[float, int]:
    read()  # warm: file listing caches and page cache, for both paths alike
    times, rows = [], 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        rows = read().num_rows
        times.append(time.perf_counter() - t0)
    return median(times), rows


def compare_reads(bench: Bench, world: BenchWorld, rollup: str, days: int) -> dict:
    start, end = PERIOD_END - timedelta(days=days), PERIOD_END
    bench.probe.memory.reset()
    ours, ours_rows = _timed(lambda: query_arrow(world.engine, rollup, start, end), bench.repeats)
    plain, plain_rows = _timed(lambda: plain_read(world, rollup, start, end), bench.repeats)
    driver_peak, _ = bench.probe.memory.peaks()
    ratio = ours / plain if plain else float("nan")
    say(
        f"read {rollup} {days} d: query path {ours:.3f}s ({ours_rows:,} rows), "
        f"plain delta-rs {plain:.3f}s ({plain_rows:,} rows), ratio {ratio:.2f}"
    )
    return {
        "rollup": rollup,
        "days": days,
        "query_path_s": round(ours, 4),
        "plain_read_s": round(plain, 4),
        "rows": ours_rows,
        "plain_rows": plain_rows,
        "ratio": round(ratio, 3),
        "driver_peak_mb": round(driver_peak, 1),
    }


def run_reads(bench: Bench, world: BenchWorld) -> dict:
    say("reads: query path vs plain delta-rs read")
    return {
        "month_hourly": compare_reads(bench, world, "energy_hourly", min(30, bench.days)),
        "year_daily": compare_reads(bench, world, "energy_daily", min(365, bench.days)),
    }
