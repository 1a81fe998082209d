"""The daemon scenario of test_daemon.py with Dagster's storage in a real PostgreSQL server.

A throwaway server (tests/system/postgres.py) holds run, event-log and schedule storage; the
storage block is the one `rollups` writes from `$DAGSTER_PG_*` (rollup_assets/instance.py),
including the password's `env:` indirection, which every process (test, daemon, code server,
run workers) must resolve (trust authentication ignores the value itself). The same late write
is corrected at every level by the real `dagster-daemon`; then the runs, their events and the
sensor ticks are read back from PostgreSQL's own tables, and the home holds no SQLite file.
"""

import json
import os
from pathlib import Path

import dagster as dg
import psycopg2
import pytest

from rollup_assets.orchestration.instance import postgres_storage_yaml
from tests.system.postgres import require_postgres, throwaway_postgres
from tests.system.test_daemon import make_world, run_daemon_scenario

# The statuses a run never leaves.
FINISHED = {
    dg.DagsterRunStatus.SUCCESS.value,
    dg.DagsterRunStatus.FAILURE.value,
    dg.DagsterRunStatus.CANCELED.value,
}


def query(conn, sql: str) -> list[tuple]:
    with conn.cursor() as cur:
        cur.execute(sql)
        return cur.fetchall()


# The scenario's own deadlines (sensor heartbeat 120 s, correction wave 600 s) plus building the
# chain exceed the suite-wide 600 s; on a shared 2-core machine the wave alone can take minutes.
@pytest.mark.timeout(1500)
def test_daemon_corrects_a_late_write_with_postgres_storage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    bin_dir = require_postgres()
    with throwaway_postgres(bin_dir=bin_dir) as pg:
        for var, value in {
            "DAGSTER_PG_HOST": pg.hostname,
            "DAGSTER_PG_PORT": str(pg.port),
            "DAGSTER_PG_USERNAME": pg.username,
            "DAGSTER_PG_DB": pg.db_name,
            "DAGSTER_PG_PASSWORD": "resolved-through-env",
        }.items():
            monkeypatch.setenv(var, value)  # daemon_env passes os.environ on to the daemon
        world = make_world(tmp_path, monkeypatch, postgres_storage_yaml(os.environ))
        instance = world.instance
        try:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            assert type(instance.schedule_storage).__name__ == "PostgresScheduleStorage"
            result = run_daemon_scenario(world, tmp_path, "postgres")
            dagster_runs = {r.run_id: r.status.value for r in instance.get_runs()}
        finally:
            instance.dispose()

        with psycopg2.connect(**pg.connect_kwargs()) as conn:
            pg_runs = dict(query(conn, "SELECT run_id, status FROM runs"))
            sensor_runs = query(
                conn,
                "SELECT r.pipeline_name, r.status FROM runs r JOIN run_tags t "
                "ON t.run_id = r.run_id WHERE t.key = 'dagster/sensor_name'",
            )
            failures = query(
                conn,
                # RUN_FAILURE is stored under its legacy name, PIPELINE_FAILURE.
                "SELECT run_id, event FROM event_logs WHERE dagster_event_type = "
                f"'{dg.DagsterEventType.RUN_FAILURE.value}'",
            )
            materialized = {
                key
                for (key,) in query(
                    conn,
                    "SELECT DISTINCT e.asset_key FROM event_logs e JOIN run_tags t "
                    "ON t.run_id = e.run_id WHERE t.key = 'dagster/sensor_name' "
                    "AND e.dagster_event_type = 'ASSET_MATERIALIZATION'",
                )
            }
            events = query(
                conn, "SELECT count(*), count(DISTINCT run_id) FROM event_logs WHERE run_id <> ''"
            )[0]
            ticks = dict(query(conn, "SELECT status, count(*) FROM job_ticks GROUP BY status"))
            pools = dict(
                query(
                    conn,
                    "SELECT concurrency_key, count(*) FROM concurrency_slots "
                    "WHERE NOT deleted GROUP BY concurrency_key",
                )
            )
        conn.close()

    assert result["commit_to_last_level_commit_s"] > 0
    # Every run Dagster knows of is a row in PostgreSQL, with the outcome Dagster read, and the
    # daemon's sensors launched some. A run still starting when the daemon was stopped may move on
    # between the two reads; a finished one never does.
    assert pg_runs.keys() == dagster_runs.keys(), (pg_runs, dagster_runs)
    finished = {run_id: status for run_id, status in dagster_runs.items() if status in FINISHED}
    assert {run_id: pg_runs[run_id] for run_id in finished} == finished, (pg_runs, dagster_runs)
    succeeded = {job for job, status in sensor_runs if status == "SUCCESS"}
    assert "energy_hourly_job" in succeeded, sensor_runs
    # The daemon's runs carried the correction above the hourly level, whether inside the hourly
    # run (the chain) or in a level's own job; either way the materializations are PostgreSQL rows.
    assert {'["energy_hourly"]', '["energy_daily"]'} <= materialized, materialized
    # The only failures allowed: runs still finishing when the scenario stopped the daemon (its
    # process group, run workers and their Spark included, gets SIGINT once every level is
    # verified), so each failed after that instant, however it reports the stop.
    early = [
        (run_id, entry["timestamp"], entry["dagster_event"].get("message"))
        for run_id, event in failures
        if (entry := json.loads(event))["timestamp"] < result["stopped_after"]
    ]
    assert early == [], early
    # Every failed run stored its failure event. Dagster writes a failure in two steps (the
    # event, then the run's row: DagsterInstance.handle_new_event), so a run the stop interrupts
    # between them keeps an unfinished row beside its event; it never reads as a success.
    failed_events = {run_id for run_id, _ in failures}
    failed_rows = {run_id for run_id, status in pg_runs.items() if status == "FAILURE"}
    assert failed_rows <= failed_events, (failed_rows, failures)
    interrupted = {run_id: pg_runs.get(run_id) for run_id in failed_events - failed_rows}
    assert set(interrupted.values()) <= {"STARTING", "STARTED", "CANCELING"}, interrupted
    assert events[1] >= len(pg_runs) and events[0] > 0, events
    assert ticks.get("SUCCESS", 0) > 0, ticks  # sensor ticks: schedule storage
    assert pools and set(pools.values()) == {1}, pools  # the per-rollup pools live there too
    home = tmp_path / "home"
    assert sorted(p.name for p in home.rglob("*.db")) == [], "SQLite storage was created"
