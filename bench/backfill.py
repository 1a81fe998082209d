"""Scenario 1, backfill: ingest the archive, materialize the whole chain, and compute the same
first level with a bare PySpark script and with DuckDB (the single-machine floor)."""

from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path

from bench.baselines import bare_spark_chain, bare_spark_hourly, duckdb_hourly, rows_in
from bench.context import Bench
from bench.generate import NOW, Dataset
from bench.harness import BenchWorld
from bench.metrics import Step, measure
from rollup_assets.model.jobs import ChangeSource


def ingest_and_backfill(bench: Bench, world: BenchWorld, dataset: Dataset) -> dict:
    """Ingest every file, then bring all five levels up to date; the per-phase measurements."""
    world.ops.activate("energy_raw", now=NOW)
    with measure(bench.probe, f"ingest {dataset.rows:,} rows ({len(dataset.files)} commits)") as s:
        for path in dataset.files:
            world.ingest(path, ChangeSource.IMPORT)
    ingest = s
    world.activate_all(NOW)
    since = datetime.now(UTC)
    with measure(bench.probe, "backfill: first level, one range run") as first:
        world.materialize_first_level(dataset)
    with measure(bench.probe, "backfill: chain propagation to the levels above") as chain:
        world.tick(NOW, sensors=("retroactive_write_sensor",))
    with measure(bench.probe, "backfill: forward lane closes the rest") as forward:
        world.tick(NOW, ("retroactive_write_sensor", "forward_aggregation_sensor"))
    with measure(bench.probe, "backfill: surfaces built (one publish run)") as surfaces:
        world.tick(NOW, ("surface_publish_sensor",))
    steps = [first, chain, forward, surfaces]
    return {
        "ingest": ingest.as_dict(),
        "first_level": {**first.as_dict(), "breakdown": breakdown(bench, first)},
        "chain": chain.as_dict(),
        "forward": forward.as_dict(),
        "surfaces": surfaces.as_dict(),
        "total": _total(steps),
        "levels": windows_by_level(world, since),
    }


# Where a first-level range run's Spark jobs come from (the driver call that ran them).
SPARK_PHASES = (
    ("fill.py", "spark_fill_aggregate_and_write"),
    ("rollup_writes.py", "spark_write_files"),
    ("comparison.py", "spark_aggregate_and_compare"),
    ("raw_reads.py", "spark_read_raw"),
)


def _phase(call_site: str) -> str:
    return next((name for marker, name in SPARK_PHASES if marker in call_site), "spark_other")


def breakdown(bench: Bench, step: Step) -> dict[str, float]:
    """The step's wall time split into its Spark jobs (by the call that ran them) and the rest:
    the driver's own work (Dagster, its event log, Delta commits, planning)."""
    bench.probe.events.settle()
    spark = bench.probe.events.job_seconds(step.started, step.ended, _phase)
    return {**spark, "driver_outside_spark": round(step.seconds - spark["spark_total"], 2)}


def _total(steps: list[Step]) -> dict:
    rows = {k: sum(s.rows_read.get(k, 0) for s in steps) for k in ("spark", "driver", "total")}
    return {
        "seconds": round(sum(s.seconds for s in steps), 3),
        "driver_peak_mb": round(max(s.driver_peak_mb for s in steps), 1),
        "jvm_peak_mb": round(max(s.jvm_peak_mb for s in steps), 1),
        "rows_read": rows,
    }


def windows_by_level(world: BenchWorld, since: datetime) -> dict[str, dict[str, int]]:
    """Windows and rows each level wrote since `since`, from the ledger's job records."""
    out: dict[str, dict[str, int]] = defaultdict(lambda: {"windows": 0, "rows": 0, "jobs": 0})
    for name in world.catalog.rollups:
        for job in world.engine.ledger.history(name, limit=10_000):
            if job.created_at >= since and job.windows_processed and job.state.terminal:
                level = out[name]
                level["windows"] += job.windows_processed
                level["rows"] += job.rows_processed or 0
                level["jobs"] += 1
    return {name: out[name] for name in world.catalog.rollups}


def alternatives(bench: Bench, dataset: Dataset) -> dict:
    """The bare PySpark hourly script, DuckDB, and the bare chain (the look-back's tables)."""
    files = [str(p) for p in dataset.files]
    out = bench.work / "alternatives"
    with measure(bench.probe, "bare PySpark: first level from the same Parquet") as spark_step:
        bare_spark_hourly(bench.spark, bench.catalog, files, out / "bare_hourly")
    with measure(bench.probe, "DuckDB: first level from the same Parquet") as duck_step:
        duckdb_hourly(bench.catalog, files, out / "duckdb_hourly.parquet")
    with measure(bench.probe, "bare PySpark: whole chain (also the look-back's tables)") as chain:
        bare_spark_chain(bench.spark, bench.catalog, files, chain_dir(bench))
    return {
        "bare_spark_hourly": {
            **spark_step.as_dict(),
            "rows_written": rows_in(out / "bare_hourly"),
        },
        "duckdb_hourly": {
            **duck_step.as_dict(),
            "rows_written": rows_in(out / "duckdb_hourly.parquet"),
        },
        "bare_spark_chain": chain.as_dict(),
    }


def chain_dir(bench: Bench) -> Path:
    return bench.work / "alternatives" / "bare_chain"


def run_backfill(bench: Bench, world: BenchWorld, dataset: Dataset) -> dict:
    ours = ingest_and_backfill(bench, world, dataset)
    alt = alternatives(bench, dataset)
    ours_first = ours["first_level"]["seconds"]
    return {
        "ours": ours,
        **alt,
        "overhead_vs_bare_spark": round(ours_first / alt["bare_spark_hourly"]["seconds"], 3),
        "chain_vs_bare_chain": round(
            ours["total"]["seconds"] / alt["bare_spark_chain"]["seconds"], 3
        ),
        "duckdb_floor_ratio": round(ours_first / alt["duckdb_hourly"]["seconds"], 3),
    }
