"""Scenario 2 through the real `dagster-daemon`: one late reading, from its raw commit to the
last level's commit, with every run launched by the daemon (each a subprocess with its own JVM).

It reuses the system-test helpers (tests/system/daemon.py) against the benchmark's own home and
warehouse; the daemon's clock is pinned to the benchmark's NOW, like the in-process ticks.
"""

from datetime import UTC, datetime

from bench.context import Bench
from bench.correction import write_late
from bench.generate import NOW, Dataset
from bench.harness import BenchWorld
from bench.metrics import say
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.windows import iso_utc
from tests.system.daemon import daemon_env, running_daemon, wait_for


def run_daemon(bench: Bench, world: BenchWorld, dataset: Dataset, timeout: float = 600) -> dict:
    env = daemon_env(world.home, world.warehouse, {"ROLLUPS_NOW": iso_utc(NOW)})
    log = bench.work / "daemon.log"
    levels = set(world.catalog.rollups)
    started = datetime.now(UTC)
    with running_daemon(env, log):
        say("daemon: waiting for the sensor daemon's heartbeat")
        wait_for(
            lambda: world.instance.get_daemon_heartbeats().get("SENSOR"),
            180,
            what="the sensor daemon",
        )
        ready = (datetime.now(UTC) - started).total_seconds()
        _, path = write_late(bench, dataset, 1, seed=bench.seed + 101)
        version = world.ingest(path, ChangeSource.MANUAL).version
        committed = world.commit_time(version)
        say(f"daemon: raw version {version} committed; waiting for all {len(levels)} levels")

        def done() -> bool:
            jobs = world.recompute_jobs_since(committed)
            return {j.rollup for j in jobs} >= levels and world.pending_recomputes() == 0

        finished = True
        try:
            wait_for(done, timeout, interval=0.5, what="every level's recompute")
        except TimeoutError:
            finished = False
    jobs = world.recompute_jobs_since(committed)
    last = max((j.finished_at for j in jobs if j.finished_at), default=None)
    latency = (last - committed).total_seconds() if last and finished else None
    say(f"daemon: commit -> last level's commit {latency}s (all levels: {finished})")
    return {
        "readings": 1,
        "daemon_ready_s": round(ready, 1),
        "commit_to_last_level_s": None if latency is None else round(latency, 3),
        "levels_recomputed": sorted({j.rollup for j in jobs}),
        "finished": finished,
        "log": str(log.name),
    }
