"""Restart: the real daemon is stopped in the middle of a correction wave and started again;
every correction still lands exactly once.

A restart here means what a host or container restart does to a DefaultRunLauncher deployment:
the in-flight run workers die with the daemon, and nothing reports their end. The test waits
for an observable event (a rollup run of the wave has STARTED), freezes the daemon's process
group, SIGKILLs every run worker then in flight (and its Spark JVM) and the rest of the group
(a SIGTERM would let the code server report the dead workers; a restart gives it no chance),
checks that readers still see each window at its old or new values, starts
a new daemon on the same Dagster home and warehouse, and waits until the wave has drained. Then:
the killed runs are failed, every changed window of every level was recomputed by exactly one
Completed job (none lost, none twice), no (entity, bucket) is duplicated, and every level equals
the pandas oracle.

The forward lane is kept idle (activation puts every watermark past the daemon's pinned clock),
so each daemon run belongs to the wave and the test stays short.
"""

import contextlib
import os
import signal
import time
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import psutil
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import sqlalchemy.exc

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window, iso_utc
from rollup_assets.orchestration.runs import UNFINISHED, DagsterRunLookup
from tests.conftest import World, days
from tests.exactly_once import changed_windows, duplicated_rows, exactly_once, old_or_new
from tests.oracle import compare_all
from tests.system.daemon import daemon_env, running_daemon, wait_for
from tests.system.test_daemon import make_world

CLOCK = datetime(2026, 2, 10, 12, 0, tzinfo=UTC)  # the daemon's pinned clock (ROLLUPS_NOW)
ACTIVATED_AT = datetime(2028, 6, 1, tzinfo=UTC)  # watermarks (one bucket back) lie past CLOCK
FIRST = date(2024, 11, 25)
N_DAYS = 10
METERS = 2
SEED = 13
# The wave: three raw commits touching different hours, days, weeks and both months.
WAVE = [
    (date(2024, 11, 27), ["meter-0000"], 1.5),
    (date(2024, 12, 3), ["meter-0001"], 0.5),
    (date(2024, 11, 30), ["meter-0000", "meter-0001"], 2.0),  # local Nov 30 and Dec 1
]


def correction(day: date, meters: list[str], factor: float) -> pa.Table:
    batch = day_batch(day, METERS, seed=SEED)
    batch = batch.filter(pc.is_in(batch["entity_id"], value_set=pa.array(meters)))
    return batch.set_column(2, "energy_kwh", pc.multiply(batch["energy_kwh"], factor))


def wave_runs(world: World, since: datetime, statuses: list[dg.DagsterRunStatus]) -> list:
    return [
        r.dagster_run
        for r in world.instance.get_run_records(
            filters=dg.RunsFilter(
                tags={"rollups/lane": "recompute"}, statuses=statuses, created_after=since
            )
        )
    ]


def worker_pids(world: World, runs: list) -> dict[str, int]:
    """run id -> the pid each run worker reported when it started (runs whose event log cannot
    be read right now are left out: a worker frozen in the middle of a commit holds its lock)."""
    lookup = DagsterRunLookup(world.instance)
    out = {}
    for run in runs:
        try:
            pid = lookup._worker_pid(run)
        except sqlalchemy.exc.OperationalError:
            continue
        if pid is not None:
            out[run.run_id] = int(pid)
    return out


def run_workers(
    world: World, daemon: psutil.Process, runs: list, known: dict[str, int]
) -> dict[str, psutil.Process]:
    """run id -> the process executing it: the pid each run worker reported when it started (as
    read before the stop in `known`, or now), checked to be one of the daemon's descendants."""
    mine = {p.pid: p for p in daemon.children(recursive=True)}
    pids = {**worker_pids(world, [r for r in runs if r.run_id not in known]), **known}
    return {
        run.run_id: mine[pids[run.run_id]]
        for run in runs
        if run.run_id in pids and pids[run.run_id] in mine
    }


def kill_tree(proc: psutil.Process) -> int:
    """SIGKILL `proc` and its descendants (its Spark JVM and Python workers); return how many."""
    try:
        tree = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in tree:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue
    return len(tree)


def quiet(world: World) -> bool:
    """Nothing left to do: no open job in the ledger and no unfinished rollup run."""
    snap = world.engine.ledger.snapshot()
    open_jobs = [j for j in snap.jobs.values() if not j.state.terminal]
    runs = world.instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED), limit=1)
    return not open_jobs and not runs


def test_daemon_restart_mid_wave_lands_every_correction_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    t0 = time.monotonic()
    world = make_world(tmp_path, monkeypatch)
    try:
        world.ops.activate("energy_raw", now=ACTIVATED_AT)
        world.ingest(
            pa.concat_tables([day_batch(d, METERS, seed=SEED) for d in days(FIRST, N_DAYS)]),
            source="Import",
        )
        world.activate_all(ACTIVATED_AT)
        start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
        world.backfill([Window(start, start + timedelta(days=N_DAYS))])
        assert compare_all(world.query, world.raw(), world.catalog) == []

        env = daemon_env(
            Path(world.instance.root_directory),
            Path(world.engine.warehouse.root),
            {"ROLLUPS_NOW": iso_utc(CLOCK), "ROLLUPS_SENSOR_INTERVAL_SECONDS": "2"},
        )
        old_raw = world.raw()
        since = datetime.now(UTC)
        killed_runs: list[str] = []
        killed_processes = 0
        with running_daemon(env, tmp_path / "daemon-1.log") as proc:
            wait_for(
                lambda: world.instance.get_daemon_heartbeats().get("SENSOR"),
                120,
                what="the first daemon's sensor loop",
            )
            versions = [world.ingest(correction(*c), source="Manual") for c in WAVE]
            # The wave is under way once one of its rollup runs has started (or already ended).
            wait_for(
                lambda: wave_runs(
                    world, since, [dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.SUCCESS]
                ),
                240,
                interval=0.5,
                what="a run of the correction wave to start",
            )
            # A host or container restart: freeze the daemon's whole process group (so nobody can
            # report anything), SIGKILL every in-flight run worker with its Spark JVM, then the
            # rest of the group: no run gets to record its end.
            daemon = psutil.Process(proc.pid)
            # Worker pids are read before the stop: a worker frozen in the middle of writing an
            # event keeps its run's event log locked.
            known = worker_pids(world, wave_runs(world, since, UNFINISHED))
            os.killpg(proc.pid, signal.SIGSTOP)
            running = wave_runs(world, since, UNFINISHED)
            workers = run_workers(world, daemon, running, known)
            for worker in workers.values():
                killed_processes += kill_tree(worker)
            killed_runs = sorted(workers)
            assert killed_runs, "no run worker was in flight when the daemon stopped"
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
                os.killpg(proc.pid, signal.SIGCONT)
            proc.wait(timeout=60)
            gone = lambda: not any(psutil.pid_exists(w.pid) for w in workers.values())  # noqa: E731
            wait_for(gone, 60, interval=0.2, what="the killed run workers to be reaped")
        new_raw = world.raw()
        changed = {
            s.name: changed_windows(s, old_raw, new_raw) for s in world.catalog.rollups.values()
        }

        # While no daemon runs: every window is old or new, nothing is duplicated.
        problems, seen = old_or_new(world.query, world.catalog, old_raw, new_raw)
        assert problems == [], problems
        assert duplicated_rows(world.engine) == []
        stopped_at = {n: seen[n][1] for n in seen}  # windows already at new values per level

        with running_daemon(env, tmp_path / "daemon-2.log"):
            wait_for(
                lambda: quiet(world) and compare_all(world.query, new_raw, world.catalog) == [],
                300,
                interval=2,
                what="the restarted daemon to drain the wave",
            )

        engine = world.engine
        assert compare_all(world.query, new_raw, world.catalog) == []
        assert duplicated_rows(engine) == []
        marks = {n: s.watermark for n, s in engine.states.all().items() if s.watermark}
        problems, verified = exactly_once(engine, since, changed, marks)
        assert problems == [], problems
        assert engine.ledger.snapshot().cursors.get("energy_raw") == max(versions)
        statuses = {r.run_id: r.status for r in wave_runs(world, since, list(dg.DagsterRunStatus))}
        assert not [r for r, s in statuses.items() if s in UNFINISHED], statuses
        for run_id in killed_runs:
            assert statuses[run_id] is dg.DagsterRunStatus.FAILURE, (run_id, statuses[run_id])
        succeeded = sum(s is dg.DagsterRunStatus.SUCCESS for s in statuses.values())
        print(
            f"\nRESTART corrections {len(WAVE)} (raw versions {versions}); runs in flight at the "
            f"stop {len(killed_runs)} ({killed_processes} processes killed); windows already new "
            f"at the stop {stopped_at}; changed windows verified exactly once {verified}; "
            f"wave runs succeeded {succeeded}, failed {len(statuses) - succeeded}; "
            f"{time.monotonic() - t0:.0f}s"
        )
    finally:
        world.instance.dispose()
