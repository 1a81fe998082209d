"""Scenario 2, late correction: late/corrected readings go in, the sensors recompute exactly what
they affect at every level. Compared with a full rebuild and a dbt-style 7-day look-back."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable

from bench.baselines import computed_sql, differing, duck, lookback_refresh, oracle_windows
from bench.context import Bench
from bench.generate import NOW, PERIOD_END, Dataset, late_readings
from bench.harness import BenchWorld, RunSpan
from bench.metrics import delta_logs, measure, median, say, written_since
from bench.reads import compare_downsampling, compare_reads
from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.jobs import ChangeSource, Job
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import open_table, read_commit
from rollup_assets.services.maintenance import fold_jobs
from rollup_assets.services.query import query_arrow
from rollup_assets.services.surface_lag import surface_lag

# The ISO week still open at NOW starts here (Monday 2025-12-29 00:00 Vienna): late readings
# land before it, so every level's bucket is closed and the correction reaches all five.
CLOSED_UNTIL = datetime(2025, 12, 28, 23, 0, tzinfo=UTC)
LOOKBACK = timedelta(days=7)
# A correction's runs; the surface publish that follows them is measured as its own step.
CORRECTION_SENSORS = ("retroactive_write_sensor", "forward_aggregation_sensor")
PUBLISH_SENSORS = ("surface_publish_sensor",)


def raw_files(world: BenchWorld, version: int | None = None) -> list[str]:
    return DeltaTable(
        world.engine.raw.uri(world.catalog.raw["energy_raw"]), version=version
    ).file_uris()


def write_late(bench: Bench, dataset: Dataset, count: int, seed: int) -> tuple[pa.Table, Path]:
    table = late_readings(dataset, count, seed, margin=PERIOD_END - CLOSED_UNTIL)
    path = bench.work / f"late-{dataset.days}d-{count}-{seed}.parquet"
    pq.write_table(table, path)
    return table, path


def correct(
    bench: Bench,
    world: BenchWorld,
    dataset: Dataset,
    count: int,
    seed: int,
    with_reads: bool = True,
) -> dict:
    """Ingest `count` late readings, tick until quiet, publish the surfaces: what each level
    recomputed and read, the bytes every step wrote, and (`with_reads`) how reads compare with
    a plain read of the surface before and after the publish."""
    table, path = write_late(bench, dataset, count, seed)
    logs = delta_logs(world.warehouse)
    with measure(bench.probe, f"ingest of {count:,} late reading(s)") as ingest_step:
        result = world.ingest(path, ChangeSource.MANUAL)
    written = {"ingest": written_since(world.warehouse, logs)}
    committed = world.commit_time(result.version)
    logs = delta_logs(world.warehouse)
    with measure(bench.probe, f"correction of {count:,} reading(s): sensors + runs") as step:
        world.tick(NOW, CORRECTION_SENSORS)
    written["correction"] = written_since(world.warehouse, logs)
    jobs = world.recompute_jobs_since(committed)
    runs = [r for r in world.runs_since(step.started - 1) if r.end <= step.ended]
    # Reads right after the wave, before any fold: while the surface lags, the query path
    # folds the differences itself; once published, it reads the surface.
    reads = {"surface_lagging": year_of_daily_rows(bench, world) if with_reads else None}
    logs = delta_logs(world.warehouse)
    published = publish_surfaces(bench, world, f"after {count:,} reading(s)")
    written["publish"] = written_since(world.warehouse, logs)
    written["total"] = {k: sum(w[k] for w in written.values()) for k in ("files", "bytes", "rows")}
    if with_reads:
        reads["surface_current"] = year_of_daily_rows(bench, world)
        reads["downsample_to_months"] = compare_downsampling(bench, world)
    levels: dict[str, dict] = {
        name: {"windows": 0, "rows_written": 0, "rows_read": 0, "runs": 0, "entities": None}
        for name in world.catalog.rollups
    }
    for job in jobs:
        level = levels[job.rollup]
        level["windows"] += job.windows_processed or 0
        level["rows_written"] += job.rows_processed or 0
        level["entities"] = "all" if job.entities is None else len(job.entities)
    forward = {"runs": 0, "rows_read": 0}
    for run in runs:
        rows = _run_rows(bench, run)
        if run.lane == "forward":
            forward["runs"] += 1
            forward["rows_read"] += rows
        elif run.rollup in levels:
            levels[run.rollup]["runs"] += 1
            levels[run.rollup]["rows_read"] += rows
    work = job_figures(jobs)
    last = max((j.finished_at for j in jobs if j.finished_at), default=None)
    latency = (last - committed).total_seconds() if last else None
    recompute_rows = sum(v["rows_read"] for v in levels.values())
    seconds = ingest_step.seconds + step.seconds + published["publish"]["seconds"]
    rows_read = ingest_step.rows_read["total"] + step.rows_read["total"] + published["rows_read"]
    return {
        "readings": count,
        "raw_version": result.version,
        "commit_to_last_level_s": None if latency is None else round(latency, 3),
        "ingest": ingest_step.as_dict(),
        "tick_loop": step.as_dict(),
        "rows_read": step.rows_read["total"],
        "recompute_rows_read": recompute_rows,
        "windows_recomputed": sum(v["windows"] for v in levels.values()),
        "levels": levels,
        "forward_lane": forward,
        "levels_recomputed": sorted({j.rollup for j in jobs}),
        "jobs": work,
        "driver_rows_read_by": bench.probe.driver.by_purpose(step.started, step.ended),
        "surface": published,
        "bytes_written": written,
        "reads_after": reads,
        # Ingest, correction and publish together, and per reading (the density figures).
        "whole_wave": {"seconds": round(seconds, 3), "rows_read": rows_read},
        "per_reading": {
            "seconds": round(seconds / count, 6),
            "rows_read": round(rows_read / count, 1),
            "bytes_written": round(written["total"]["bytes"] / count, 1),
        },
        "_changes": table.select(["entity_id", "ts"]),
    }


def publish_surfaces(bench: Bench, world: BenchWorld, label: str) -> dict:
    """The publish run that brings every lagging surface up to date, measured on its own: the
    lag it closes (seconds from each surface's oldest unpublished change to the publish's
    start, and to its end), its time and rows read, and what it wrote (from the surfaces' Delta
    logs: rows, bytes and files of its commits)."""
    engine = world.engine
    specs = list(world.catalog.rollups.values())
    before = {s.name: _surface_version(world, s) for s in specs}
    start = datetime.now(UTC)
    lags = {s.name: surface_lag(engine, s) for s in specs}
    lagging = {n: lag.seconds(start) for n, lag in lags.items() if lag.needs_publish}
    with measure(bench.probe, f"surface publish {label}") as step:
        world.tick(NOW, PUBLISH_SENSORS)
    written = {"rows": 0, "bytes": 0, "files_added": 0, "files_removed": 0}
    for spec in specs:
        uri = engine.rollups.surface_uri(spec)
        for version in range(before[spec.name] + 1, _surface_version(world, spec) + 1):
            actions = read_commit(uri, version)
            adds = [a["add"] for a in actions if "add" in a]
            written["rows"] += sum(
                json.loads(a.get("stats") or "{}").get("numRecords", 0) for a in adds
            )
            written["bytes"] += sum(int(a["size"]) for a in adds)
            written["files_added"] += len(adds)
            written["files_removed"] += sum(1 for a in actions if "remove" in a)
    still = [s.name for s in specs if surface_lag(engine, s).needs_publish]
    known = [v for v in lagging.values() if v is not None]
    worst = max(known, default=0.0)
    return {
        "lag_at_publish_s": {n: None if v is None else round(v, 3) for n, v in lagging.items()},
        "max_lag_at_publish_s": round(worst, 3),
        # From the oldest unpublished change to the end of the publish: what plain readers
        # waited at most, had the publish started right after the correction's runs.
        "max_lag_closed_s": round(worst + step.seconds, 3),
        "publish": step.as_dict(),
        "rows_read": step.rows_read.get("total", 0),
        "rows_read_by": bench.probe.driver.by_purpose(step.started, step.ended),
        "written": written,
        "lagging_after": still,
    }


def year_of_daily_rows(bench: Bench, world: BenchWorld) -> dict:
    """The query path's read of a year of daily rows (the archive's days at most) against a
    plain delta-rs read of the surface."""
    return compare_reads(bench, world, "energy_daily", min(365, bench.days))


def _surface_version(world: BenchWorld, spec: RollupSpec) -> int:
    table = open_table(world.engine.rollups.surface_uri(spec))
    return -1 if table is None else table.version()


def job_figures(jobs: list[Job]) -> dict:
    """What the jobs recorded, summed: cells changed / skipped as unchanged / corrected from
    changes, change rows applied, source rows aggregated, and jobs per technique."""
    techniques: dict[str, int] = {}
    for j in jobs:
        if j.technique:
            techniques[j.technique] = techniques.get(j.technique, 0) + 1
    return {
        "cells_changed": sum(j.cells_changed or 0 for j in jobs),
        "cells_skipped": sum(j.cells_skipped or 0 for j in jobs),
        "cells_applied": sum(j.cells_applied or 0 for j in jobs),
        "change_rows": sum(j.change_rows or 0 for j in jobs),
        "source_rows": sum(j.source_rows or 0 for j in jobs),
        "techniques": techniques,
    }


def identical_reingest(bench: Bench, world: BenchWorld, day: datetime) -> dict:
    """Re-ingest one stored UTC day of every meter, value for value: what it recomputes."""
    spec = world.catalog.raw["energy_raw"]
    stored = world.engine.raw.read_arrow(spec, [Window(day, day + timedelta(days=1))])
    path = bench.work / "identical-day.parquet"
    supplied = [c.name for c in spec.columns if not c.is_computed]  # what a producer sends
    pq.write_table(stored.select(["entity_id", "ts", *supplied]), path)
    since = datetime.now(UTC)
    with measure(bench.probe, f"identical re-ingest of {stored.num_rows:,} rows") as step:
        result = world.ingest(path, ChangeSource.MANUAL)
        world.tick(NOW, CORRECTION_SENSORS)
    jobs = world.recompute_jobs_since(since)
    return {
        "rows": stored.num_rows,
        "inserted": result.inserted,
        "updated": result.updated,
        "raw_version": result.version,
        "tick_loop": step.as_dict(),
        "jobs": len(jobs),
        "cells_recomputed": sum((j.cells_changed or 0) + (j.cells_skipped or 0) for j in jobs),
    }


def fold_pointers(bench: Bench, world: BenchWorld) -> dict:
    """What maintenance's folding does once the waves' flips are past the rollback window:
    buckets queued, the tick that folds them, and the pointer rows left."""
    later = world.past_rollback_window()
    with measure(bench.probe, "fold differences (maintenance's jobs, then the sensors)") as step:
        jobs = fold_jobs(later.engine, set(), datetime.now(UTC))
        later.engine.ledger.record(jobs)
        later.tick(NOW, CORRECTION_SENSORS)
    after = pointer_rows(later)
    say(f"pointer rows after folding {sum(len(j.windows) for j in jobs):,} buckets: {after}")
    return {
        "buckets": sum(len(j.windows) for j in jobs),
        "tick_loop": step.as_dict(),
        "pointer_rows": after,
        "surface": publish_surfaces(bench, later, "after the fold"),
    }


def pointer_rows(world: BenchWorld) -> dict[str, int]:
    """Rows of each rollup's pointer table (what a read resolves generations against)."""
    return {
        name: world.engine.rollups.snapshot(spec).pointers.num_rows
        for name, spec in world.catalog.rollups.items()
    }


def _run_rows(bench: Bench, run: RunSpan) -> int:
    return bench.probe.rows_read(run.start, run.end)["total"]


def left_wrong_by_lookback(
    bench: Bench, world: BenchWorld, changes: pa.Table, before: int, after: int
) -> dict[str, dict[str, int]]:
    """Per level: windows whose true value the correction changed, and how many of those a
    7-day look-back leaves wrong (those holding a change older than the look-back horizon)."""
    con = duck()
    horizon = pa.scalar(PERIOD_END - LOOKBACK, TS)
    out = {}
    old, new = raw_files(world, before), raw_files(world, after)
    computed = computed_sql(world.catalog)
    for spec in world.catalog.rollups.values():
        was = oracle_windows(spec, old, changes, con, computed)
        now = oracle_windows(spec, new, changes, con, computed)
        changed = differing(spec, now, was, con)
        stale = pa.compute.sum(pa.compute.less(changed["first_change"], horizon)).as_py() or 0
        out[spec.name] = {"changed": changed.num_rows, "left_wrong": int(stale)}
    con.close()
    return out


def wrong_windows_ours(world: BenchWorld, changes: pa.Table) -> dict[str, int]:
    """Per level: windows containing any of `changes` whose value, read through the query path,
    differs from the oracle over the current raw data (0 = every correction landed)."""
    con = duck()
    files = raw_files(world)
    computed = computed_sql(world.catalog)
    out = {}
    for spec in world.catalog.rollups.values():
        expected = oracle_windows(spec, files, changes, con, computed)
        starts = expected["bucket_start"]
        lo, hi = pa.compute.min_max(starts).values()
        wrong = 0
        for start, end in _months(lo.as_py(), hi.as_py()):
            inside = pa.compute.and_(
                pa.compute.greater_equal(starts, pa.scalar(start, starts.type)),
                pa.compute.less(starts, pa.scalar(end, starts.type)),
            )
            chunk = expected.filter(inside)
            if not chunk.num_rows:
                continue
            ents = pa.compute.unique(chunk["entity_id"]).to_pylist()
            ours = query_arrow(world.engine, spec.name, start, end, ents)
            wrong += differing(spec, chunk, ours, con).num_rows
        out[spec.name] = wrong
    con.close()
    return out


def _months(lo: datetime, hi: datetime) -> list[tuple[datetime, datetime]]:
    lo, hi = lo.astimezone(UTC), hi.astimezone(UTC)
    start = datetime(lo.year, lo.month, 1, tzinfo=UTC)
    out = []
    while start <= hi:
        end = datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)
        out.append((start, end))
        start = end
    return out


def one_reading_repeats(bench: Bench, world: BenchWorld, dataset: Dataset, seed: int) -> dict:
    """`bench.repeats` single-reading corrections in a row: the first one's full record, plus
    every repeat's latency and tick-loop time (their medians are the scaling figures)."""
    cases, changes = [], []
    for r in range(bench.repeats):
        case = correct(bench, world, dataset, 1, seed=seed + 1000 * r)
        changes.append(case.pop("_changes"))
        cases.append(case)
    first = cases[0]
    first["repeats"] = {
        "commit_to_last_level_s": [c["commit_to_last_level_s"] for c in cases],
        "tick_loop_s": [c["tick_loop"]["seconds"] for c in cases],
        "rows_read": [c["rows_read"] for c in cases],
        "publish_s": [c["surface"]["publish"]["seconds"] for c in cases],
        "publish_rows_read": [c["surface"]["rows_read"] for c in cases],
        "publish_bytes_written": [c["surface"]["written"]["bytes"] for c in cases],
        "surface_lag_closed_s": [c["surface"]["max_lag_closed_s"] for c in cases],
    }
    first["median_commit_to_last_level_s"] = median(first["repeats"]["commit_to_last_level_s"])
    first["median_tick_loop_s"] = median(first["repeats"]["tick_loop_s"])
    first["_changes"] = changes
    return first


def run_corrections(bench: Bench, world: BenchWorld, dataset: Dataset, chain: Path) -> dict:
    """Every late-reading count in turn on the backfilled world (one reading `bench.repeats`
    times), then the look-back refresh, then one check that every level equals the oracle for
    all windows the corrections touched."""
    out: dict = {"cases": [], "lookback": {}}
    all_changes: list[pa.Table] = []
    for i, count in enumerate(bench.late_counts):
        before = world.engine.raw.table(world.catalog.raw["energy_raw"]).version()
        if count == 1:
            case = one_reading_repeats(bench, world, dataset, seed=bench.seed + i)
            changes = case.pop("_changes")
            all_changes += changes
            first_changes, after = changes[0], case["raw_version"]
        else:
            case = correct(bench, world, dataset, count, seed=bench.seed + i)
            first_changes, after = case.pop("_changes"), case["raw_version"]
            all_changes.append(first_changes)
        with measure(bench.probe, "oracle: windows changed, and left wrong by a look-back", False):
            case["windows_changed"] = left_wrong_by_lookback(
                bench, world, first_changes, before, after
            )
        out["cases"].append(case)
    horizon = PERIOD_END - LOOKBACK
    files = raw_files(world)
    recent = [f for f in files if _day_of(f) >= (horizon - timedelta(days=1)).date().isoformat()]
    with measure(bench.probe, "dbt-style 7-day look-back refresh (bare PySpark)") as step:
        lookback_refresh(
            bench.spark, bench.catalog, recent, chain, bench.work / "lookback", horizon
        )
    out["lookback"] = step.as_dict()
    day = max(dataset.start, CLOSED_UNTIL.replace(hour=0) - timedelta(days=3))
    out["identical_reingest"] = identical_reingest(bench, world, day)
    out["pointer_rows"] = pointer_rows(world)
    say(f"pointer rows after the correction waves: {out['pointer_rows']}")
    out["fold"] = fold_pointers(bench, world)
    with measure(bench.probe, "verify: every touched window equals the oracle", False):
        out["wrong_windows_after"] = wrong_windows_ours(world, pa.concat_tables(all_changes))
    say(f"windows still wrong after the automatic recompute: {out['wrong_windows_after']}")
    return out


def _day_of(uri: str) -> str:
    part = next((p for p in uri.split("/") if p.startswith("day=")), "day=9999-12-31")
    return part.removeprefix("day=")
