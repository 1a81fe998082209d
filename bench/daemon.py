"""Scenario 2 through the real `dagster-daemon`: one late reading, from its raw commit to the
last level's commit, with every run launched by the daemon (each a subprocess, starting Spark
only if its work needs it), five times; the median, and where the time went.

It reuses the system-test helpers (tests/system/daemon.py) against the benchmark's own home and
warehouse; the daemon's clock is pinned to the benchmark's NOW, like the in-process ticks.
"""

from datetime import UTC, datetime
from statistics import median

from bench.context import Bench
from bench.correction import write_late
from bench.generate import NOW, Dataset
from bench.harness import BenchWorld
from bench.metrics import say
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.windows import iso_utc
from tests.system.daemon import daemon_env, latency_phases, running_daemon, settled, wait_for

REPEATS = 5


def run_daemon(
    bench: Bench, world: BenchWorld, dataset: Dataset, timeout: float = 600, repeats: int = REPEATS
) -> dict:
    """`repeats` one-reading corrections, one after the other, through one daemon running with
    the shipped defaults (sensor interval, run queue); the median and each one's phases."""
    env = daemon_env(world.home, world.warehouse, {"ROLLUPS_NOW": iso_utc(NOW)})
    env.pop("ROLLUPS_SENSOR_INTERVAL_SECONDS", None)  # the shipped default, not the tests' 5 s
    log = bench.work / "daemon.log"
    levels = set(world.catalog.rollups)
    started = datetime.now(UTC)
    samples: list[dict] = []
    with running_daemon(env, log):
        say("daemon: waiting for the sensor daemon's heartbeat")
        wait_for(
            lambda: world.instance.get_daemon_heartbeats().get("SENSOR"),
            180,
            what="the sensor daemon",
        )
        ready = (datetime.now(UTC) - started).total_seconds()
        for i in range(repeats):
            sample = _one_reading(bench, world, dataset, levels, timeout, seed=bench.seed + 101 + i)
            samples.append(sample)
            if sample["commit_to_last_level_s"] is None:
                break
    latencies = [s["commit_to_last_level_s"] for s in samples]
    finished = all(v is not None for v in latencies) and len(samples) == repeats
    phases = ("sensor_wait_s", "queue_s", "launch_s", "spark_s", "run_work_s")
    return {
        "readings": 1,
        "repeats": repeats,
        "daemon_ready_s": round(ready, 1),
        "commit_to_last_level_s": round(median(latencies), 3) if finished else None,
        "samples_s": latencies,
        "median_phases_s": {
            p: round(median(s["phases"].get(p, 0.0) for s in samples), 2) for p in phases
        }
        if finished
        else {},
        "samples": samples,
        "finished": finished,
        "log": str(log.name),
    }


def _one_reading(
    bench: Bench, world: BenchWorld, dataset: Dataset, levels: set[str], timeout: float, seed: int
) -> dict:
    _, path = write_late(bench, dataset, 1, seed=seed)
    version = world.ingest(path, ChangeSource.MANUAL).version
    committed = world.commit_time(version)
    say(f"daemon: raw version {version} committed; waiting for all {len(levels)} levels")

    def done() -> bool:
        jobs = world.recompute_jobs_since(committed)
        return {j.rollup for j in jobs} >= levels and world.pending_recomputes() == 0

    finished = True
    try:
        wait_for(done, timeout, interval=0.2, what="every level's recompute")
    except TimeoutError:
        finished = False
    jobs = world.recompute_jobs_since(committed)
    last = max((j.finished_at for j in jobs if j.finished_at), default=None)
    latency = (last - committed).total_seconds() if last and finished else None
    phases = latency_phases(world.instance, committed, last) if last else {}
    say(
        f"daemon: commit -> last level's commit {latency}s (all levels: {finished}); "
        + ", ".join(f"{k} {v}" for k, v in phases.items() if k != "runs")
    )
    # The daemon may still be finishing the run (its last events, the process exit).
    wait_for(lambda: settled(world.instance, interval_s=1.0), 120, what="the daemon to go idle")
    return {
        "raw_version": version,
        "commit_to_last_level_s": None if latency is None else round(latency, 3),
        "levels_recomputed": sorted({j.rollup for j in jobs}),
        "phases": phases,
    }
