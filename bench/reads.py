"""Scenario 3, reads: the generation-resolving read path (`query_arrow`) against a plain
delta-rs read of the same rows and time range from the rollup's surface table (the table a
plain Delta reader is pointed at: the active rows only, so both return the same rows, however
many superseded generations the row table keeps for the generation retention); and
the answers that read more than stored buckets against a plain `query_arrow` of the same rows
(what the mode adds to the stored read; a plain delta-rs read of those rows is timed beside it):
a real-time read with one day beyond the watermark, and a downsampling of daily rows to months."""

import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.dataset as ds
from deltalake import DeltaTable

from bench.context import Bench
from bench.generate import PERIOD_END
from bench.harness import BenchWorld
from bench.metrics import median, say
from rollup_assets.compute.arrow_types import TS
from rollup_assets.services.downsample import downsample_arrow
from rollup_assets.services.query import query_arrow
from rollup_assets.services.realtime import realtime_arrow
from rollup_assets.services.surface_layout import query_columns


def plain_read(
    world: BenchWorld, rollup: str, start: datetime | None, end: datetime | None
) -> pa.Table:
    """What a user gets from delta-rs directly, reading the surface table: the active rows with
    bucket_start in [start, end) (None and None: every row), in the columns a query returns
    (not the averages' partials and the fold state the surface also holds, which the query path
    does not read either)."""
    spec = world.catalog.rollup(rollup)
    table = DeltaTable(world.engine.rollups.surface_uri(spec))
    if start is None or end is None:
        return table.to_pyarrow_dataset().to_table(columns=query_columns(spec))
    start_s, end_s = pa.scalar(start, TS), pa.scalar(end, TS)
    cond = (ds.field("bucket_start") >= start_s) & (ds.field("bucket_start") < end_s)
    return table.to_pyarrow_dataset().to_table(columns=query_columns(spec), filter=cond)


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


# The answers beyond stored buckets are cheap to time: more repetitions steady their medians.
MODE_REPEATS = 7


def compare_realtime(bench: Bench, world: BenchWorld, days: int) -> dict:
    """A real-time read of `days` of hourly rows whose last day is beyond the watermark (set
    back one day for the measurement, then restored; no run happens meanwhile) vs a plain read
    of the same range. The last day's stored rows are current, so both return the same cells."""
    rollup = "energy_hourly"
    start, end = PERIOD_END - timedelta(days=days), PERIOD_END
    states = world.engine.states
    mark = states.get(rollup).watermark
    back = PERIOD_END - timedelta(days=1)
    states.update(
        rollup, lambda s: replace(s, watermark=back), reason="bench: one day live", actor="bench"
    )
    try:
        repeats = max(bench.repeats, MODE_REPEATS)
        live, live_rows = _timed(lambda: realtime_arrow(world.engine, rollup, start, end), repeats)
        plain, plain_rows = _timed(lambda: query_arrow(world.engine, rollup, start, end), repeats)
        delta_rs, _ = _timed(lambda: plain_read(world, rollup, start, end), repeats)
    finally:
        states.update(
            rollup,
            lambda s: replace(s, watermark=mark) if s.watermark == back else None,
            reason="bench: watermark restored",
            actor="bench",
        )
    ratio = live / plain if plain else float("nan")
    say(
        f"real-time read {rollup} {days} d, 1 d beyond the watermark: {live:.3f}s "
        f"({live_rows:,} rows), plain read {plain:.3f}s ({plain_rows:,} rows), ratio {ratio:.2f}"
    )
    return {
        "rollup": rollup,
        "days": days,
        "live_days": 1,
        "mode_s": round(live, 4),
        "plain_s": round(plain, 4),
        "delta_rs_s": round(delta_rs, 4),
        "rows": live_rows,
        "plain_rows": plain_rows,
        "ratio": round(ratio, 3),
        "vs_delta_rs": round(live / delta_rs, 3) if delta_rs else None,
    }


def compare_downsampling(bench: Bench, world: BenchWorld) -> dict:
    """Every daily row (a year at the default size) downsampled to months vs a plain read of
    the same rows."""
    rollup = "energy_daily"
    repeats = max(bench.repeats, MODE_REPEATS)
    months, month_rows = _timed(lambda: downsample_arrow(world.engine, rollup, "month"), repeats)
    plain, plain_rows = _timed(lambda: query_arrow(world.engine, rollup), repeats)
    delta_rs, _ = _timed(lambda: plain_read(world, rollup, None, None), repeats)
    ratio = months / plain if plain else float("nan")
    say(
        f"downsample {rollup} to months: {months:.3f}s ({month_rows:,} rows), plain read of "
        f"the daily rows {plain:.3f}s ({plain_rows:,} rows), ratio {ratio:.2f}"
    )
    return {
        "rollup": rollup,
        "days": bench.days,
        "every": "month",
        "mode_s": round(months, 4),
        "plain_s": round(plain, 4),
        "delta_rs_s": round(delta_rs, 4),
        "rows": month_rows,
        "plain_rows": plain_rows,
        "ratio": round(ratio, 3),
        "vs_delta_rs": round(months / delta_rs, 3) if delta_rs else None,
    }


def run_read_modes(bench: Bench, world: BenchWorld) -> dict:
    say("reads: real-time and downsampling vs a plain read of the same rows")
    return {
        "realtime_month_hourly": compare_realtime(bench, world, min(30, bench.days)),
        "downsample_year_daily": compare_downsampling(bench, world),
    }
