"""One benchmark run: generate, run the scenarios in order, judge the goals, write the report.

Order matters and is fixed: the main archive is backfilled (scenario 1), corrected (2), read (3),
and handed to the real daemon last; the surface's own archives (5) and the width and length
archives (4) are built and removed one by one.
Everything is written under the work directory, which is removed at the end unless kept.
"""

import contextlib
import os
import platform
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import psutil
from pyspark.sql import functions as F

from bench.backfill import chain_dir, run_backfill
from bench.context import Bench, Size
from bench.correction import run_corrections
from bench.daemon import run_daemon
from bench.generate import Dataset, write_dataset
from bench.harness import BenchWorld, bench_session
from bench.metrics import MemorySampler, Probe, SparkEventLog, lifetime_peak_rss_mb, say
from bench.reads import run_read_modes, run_reads
from bench.report import judge, plot, render, table_rows, write_json
from bench.scaling import run_scaling
from bench.surface import run_surface
from bench.writers import run_writers
from rollup_assets.model.spec_loader import load_catalog


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
    }


@contextlib.contextmanager
def run_logs(path: Path) -> Iterator[None]:
    """Send what Dagster's console logger writes for every run (stderr) to `path`, so the
    progress lines stay readable; errors still surface as exceptions."""
    with open(path, "a", encoding="utf-8") as fh, contextlib.redirect_stderr(fh):
        yield


def warm_up(bench: Bench) -> None:
    """One small job first, so no scenario pays for the JVM's first-query warm-up."""
    spark = bench.spark
    spark.range(0, 2_000_000, numPartitions=4).groupBy(
        (F.col("id") % 97).alias("k")
    ).count().collect()


def scenarios_on(
    bench: Bench,
    dataset: Dataset,
    sc: dict,
    scenarios: tuple[str, ...],
    saved: Callable[[], None],
) -> None:
    """Run the chosen scenarios in order, calling `saved` after each (partial results). The
    surface scenario alone needs no main archive (it writes its own rows)."""
    if set(scenarios) <= {"surface"}:
        sc["surface"] = run_surface(bench)
        saved()
        return
    with BenchWorld.create(bench.work / "main") as world:
        sc["backfill"] = run_backfill(bench, world, dataset)
        saved()
        if "writers" in scenarios:
            sc["writers"] = run_writers(bench, world, dataset)
            saved()
        if "correction" in scenarios or "scaling" in scenarios:
            sc["correction"] = run_corrections(bench, world, dataset, chain_dir(bench))
            saved()
        if "read" in scenarios:
            sc["read"] = run_reads(bench, world)
            sc["read_modes"] = run_read_modes(bench, world)
            saved()
        if "daemon" in scenarios:
            sc["daemon"] = run_daemon(bench, world, dataset)
            saved()
    if "surface" in scenarios:
        sc["surface"] = run_surface(bench)
        saved()
    if "scaling" in scenarios:
        wave = next((c for c in sc["correction"]["cases"] if c["readings"] == 100), None)
        if wave is None:
            say("width and length: skipped (the late-reading counts have no 100-reading wave)")
        else:
            sc["scaling"] = run_scaling(bench, wave, dataset.rows)


def finish(
    results: dict,
    bench: Bench,
    dataset: Dataset,
    memory: MemorySampler,
    started: datetime,
    t0: float,
    command: str,
    out: Path,
) -> None:
    """Judge the goals on what has been measured so far and write results.json."""
    results["meta"] = {
        "size": bench.size_name,
        "meters": bench.meters,
        "days": bench.days,
        "raw_rows": dataset.rows,
        "seed": bench.seed,
        "scenarios": sorted(results["scenarios"]),
        "started_at": started.isoformat(),
        "duration_s": round(time.monotonic() - t0, 1),
        "machine": machine(),
        "scaling_days": list(bench.scaling_days),
        "late_counts": list(bench.late_counts),
        "repeats": bench.repeats,
        "command": command,
    }
    driver_peak = memory.peaks()[0]
    results["peak_driver_rss_mb"] = round(max(lifetime_peak_rss_mb(), driver_peak), 1)
    results["peak_jvm_rss_mb"] = round(memory.jvm_lifetime_peak(), 1)
    results["table"] = table_rows(results)
    results["goals"] = judge(results)
    write_json(results, out)


def run(
    size_name: str,
    size: Size,
    out: Path,
    work: Path,
    scenarios: tuple[str, ...],
    keep: bool,
    command: str,
) -> dict:
    started = datetime.now(UTC)
    t0 = time.monotonic()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    memory = MemorySampler().start()
    say("starting Spark (local[2]) and warming up the JVM")
    spark = bench_session(work / "spark-events")
    probe = Probe(memory, SparkEventLog(work / "spark-events"))
    probe.driver.install()
    bench = Bench(work, size_name, size, spark, probe, load_catalog())
    results: dict = {"scenarios": {}}
    try:
        warm_up(bench)
        if set(scenarios) <= {"surface"}:
            dataset = Dataset(work / "data", [], bench.meters, bench.days, 0, bench.seed)
        else:
            say(f"generating {bench.meters} meters x {bench.days} days of 15-minute readings")
            dataset = write_dataset(work / "data", bench.meters, bench.days, seed=bench.seed)
            say(f"generated {dataset.rows:,} rows in {len(dataset.files)} Parquet file(s)")
        with run_logs(work / "runs.log"):
            scenarios_on(
                bench,
                dataset,
                results["scenarios"],
                scenarios,
                lambda: finish(results, bench, dataset, memory, started, t0, command, out),
            )
    finally:
        probe.driver.uninstall()
        memory.stop()
        spark.stop()
        if not keep:
            shutil.rmtree(work, ignore_errors=True)
    finish(results, bench, dataset, memory, started, t0, command, out)
    plot(results, out.with_suffix(".png"))
    print(render(results), flush=True)
    say(f"wrote {out} and {out.with_suffix('.png')}")
    return results
