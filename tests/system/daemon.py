"""Starting and stopping a real `dagster-daemon` against a temporary Dagster home."""

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import dagster as dg

from rollup_assets.orchestration.instance import (
    EVENT_BATCH_SIZE,
    RUN_LAUNCHER_YAML,
    RUN_QUEUE_YAML,
    sqlite_storage_yaml,
)
from rollup_assets.orchestration.runs import UNFINISHED

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent

# The daemon launches each run as a subprocess with its own JVM; two at a time keeps a 2-core
# machine responsive. Op-granularity pools (one per rollup, limit 1) serialize writers.
DAEMON_YAML = (
    """\
concurrency:
  pools:
    default_limit: 1
    granularity: op
  runs:
    max_concurrent_runs: 2
telemetry:
  enabled: false
"""
    + RUN_QUEUE_YAML
    + RUN_LAUNCHER_YAML
)


def write_home(home: Path, storage_yaml: str = "") -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(DAEMON_YAML + (storage_yaml or sqlite_storage_yaml(home)))


def daemon_env(home: Path, warehouse: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ROLLUPS_WAREHOUSE": str(warehouse),
        "ROLLUPS_SENSOR_INTERVAL_SECONDS": "5",
        "ROLLUPS_SPARK_MASTER": "local[1]",
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1",
        "DAGSTER_EVENT_BATCH_SIZE": str(EVENT_BATCH_SIZE),
        "PATH": f"{BIN}:{os.environ.get('PATH', '')}",
        **(extra or {}),
    }


@contextmanager
def running_daemon(env: dict[str, str], log_path: Path) -> Iterator[subprocess.Popen]:
    """`dagster-daemon run` in its own process group; killed (group) on exit, whatever happened."""
    # A background process inherits SIGINT as ignored; restore the default so it can be stopped.
    launcher = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "os.execvp(sys.argv[1], sys.argv[1:])"
    )
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-c",
                launcher,
                str(BIN / "dagster-daemon"),
                "run",
                "-w",
                "workspace.yaml",
            ],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            for sig, wait in ((signal.SIGINT, 20), (signal.SIGKILL, 10)):
                if proc.poll() is not None:
                    break
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue


def wait_for(predicate, timeout: float, interval: float = 1.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


def settled(instance: dg.DagsterInstance, interval_s: float = 7.0) -> bool:
    """No run queued or in flight, now and again after more than one sensor interval (5 s), so
    the daemon had a tick to launch more and did not."""
    for attempt in range(2):
        if instance.get_run_records(filters=dg.RunsFilter(statuses=UNFINISHED), limit=1):
            return False
        if attempt == 0:
            time.sleep(interval_s)
    return True


LAUNCH_EVENTS = {
    dg.DagsterEventType.RUN_ENQUEUED: "enqueued",
    dg.DagsterEventType.RUN_DEQUEUED: "dequeued",
    dg.DagsterEventType.RUN_STARTING: "starting",
    dg.DagsterEventType.RUN_START: "started",
}


def latency_phases(instance: dg.DagsterInstance, committed: datetime, last: datetime) -> dict:
    """Where a correction's time went, from the raw commit to the last level's commit, in
    seconds: the sensor's wait (commit -> the first run created), the run queue (created ->
    dequeued), the launch (dequeued -> the run process executing: a new process loading the
    code), Spark (getting a session ready, 0 when the run needed none) and the rest of the run
    up to the last level's commit (its data work and commits), plus each run's own marks."""
    records = instance.get_run_records(filters=dg.RunsFilter(created_after=committed))
    runs = []
    for r in sorted(records, key=lambda r: r.create_timestamp):
        marks = {
            LAUNCH_EVENTS[e.event_log_entry.dagster_event_type]: e.event_log_entry.timestamp
            for e in instance.get_records_for_run(
                r.dagster_run.run_id, of_type=set(LAUNCH_EVENTS)
            ).records
            if e.event_log_entry.dagster_event_type is not None
        }
        spark_ms = max(
            (
                int(meta["spark_ready_ms"].value)
                for m in instance.get_records_for_run(
                    r.dagster_run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
                ).records
                if (meta := m.event_log_entry.asset_materialization.metadata)  # type: ignore[union-attr]
                and "spark_ready_ms" in meta
            ),
            default=0,
        )
        created = r.create_timestamp.timestamp()
        runs.append(
            {
                "rollup": r.dagster_run.tags.get("rollups/rollup", r.dagster_run.job_name),
                "created_s": round(created - committed.timestamp(), 2),
                **{k: round(v - created, 2) for k, v in marks.items()},
                "spark_ready_s": spark_ms / 1000,
            }
        )
    if not runs:
        return {"runs": []}
    first = runs[0]
    dequeued = first.get("dequeued", first.get("starting", 0.0))
    started = first.get("started", dequeued)
    work = (last - committed).total_seconds() - first["created_s"] - started
    return {
        "sensor_wait_s": first["created_s"],
        "queue_s": round(dequeued, 2),
        "launch_s": round(started - dequeued, 2),
        "spark_s": first["spark_ready_s"],
        "run_work_s": round(work - first["spark_ready_s"], 2),
        "runs": runs,
    }
