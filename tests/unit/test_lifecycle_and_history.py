"""States and fields no other test reaches: an archive whose activation failed, the job history's
cap of 50 recompute jobs, and the last recompute failure in the health fields. Delta only (no
Spark)."""

import json
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from rollup_assets.cli import app as cli
from rollup_assets.cli import main
from rollup_assets.model.errors import (
    ArchiveActivationFailedError,
    ArchiveNotActivatedError,
    RollupSourceMissingError,
)
from rollup_assets.model.jobs import ChangeSource, Job, JobState, Lane, Trigger, fold
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.health import health
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.operations import Operations

NOW = datetime(2025, 6, 10, 12, tzinfo=UTC)
H = timedelta(hours=1)
HOUR = (Window(NOW - 30 * H, NOW - 29 * H),)


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(load_catalog(), Warehouse(str(tmp_path / "wh")))


def readings(tmp_path: Path) -> Path:
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"entity_id": ["m1"], "ts": [NOW - 30 * H], "energy_kwh": [1.0]}), path)
    return path


def test_a_failed_activation_leaves_the_archive_failed_until_it_is_enabled(
    engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ops = Operations(engine, actor="test")

    def unreachable(spec: object) -> int:
        raise OSError("the warehouse is not writable")

    with monkeypatch.context() as mp:
        mp.setattr(engine.raw, "ensure_table", unreachable)
        with pytest.raises(ArchiveActivationFailedError, match="not writable"):
            ops.activate("energy_raw", now=NOW)
    state = engine.states.get("energy_raw")
    assert state.status is ArchiveStatus.FAILED
    assert "activation failed" in state.reason and "not writable" in state.reason
    assert engine.states.history("energy_raw")[-1].changed_by == "test"
    # Nothing may use a failed archive: ingest, a rollup over it.
    with pytest.raises(ArchiveNotActivatedError, match="status Failed"):
        ingest_file(engine, "energy_raw", readings(tmp_path), ChangeSource.PIPELINE)
    with pytest.raises(RollupSourceMissingError, match="Failed"):
        ops.activate("energy_hourly", now=NOW)
    # Once the cause is gone, enable retries the activation.
    assert ops.enable("energy_raw", now=NOW).status is ArchiveStatus.ACTIVATED
    assert ingest_file(engine, "energy_raw", readings(tmp_path), ChangeSource.PIPELINE).rows == 1


def forward_job(i: int) -> Job:
    return Job(
        "energy_hourly",
        Trigger.FORWARD if i % 2 else Trigger.OPEN_BUCKET,
        HOUR,
        state=JobState.COMPLETED,
        created_at=NOW + i * timedelta(seconds=1),
    )


@pytest.fixture
def rollups_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    for cache in (cli.settings, cli.catalog, cli.engine):
        cache.cache_clear()
    yield CliRunner()
    for cache in (cli.settings, cli.catalog, cli.engine):
        cache.cache_clear()


def test_forward_jobs_never_push_recompute_jobs_out_of_the_history(
    engine: Engine, rollups_cli: CliRunner
) -> None:
    recomputes = [
        Job("energy_hourly", trigger, HOUR, state=JobState.COMPLETED, created_at=NOW - i * H)
        for i, trigger in enumerate((Trigger.MANUAL, Trigger.PERIODIC, Trigger.CHAIN))
    ]
    engine.ledger.record([*recomputes, *[forward_job(i) for i in range(60)]])
    newest_first = [j.job_id for j in recomputes]  # created an hour apart, newest first
    assert [j.job_id for j in engine.ledger.history("energy_hourly", lane=Lane.RECOMPUTE)] == (
        newest_first
    )
    assert len(engine.ledger.history("energy_hourly")) == 50  # every lane: capped

    res = rollups_cli.invoke(main, ["jobs", "energy_hourly", "--format", "json"])
    assert res.exit_code == 0, res.output
    assert [r["job_id"] for r in json.loads(res.stdout)] == newest_first
    res = rollups_cli.invoke(
        main, ["jobs", "energy_hourly", "--lane", "forward", "--limit", "5", "--format", "json"]
    )
    rows = json.loads(res.stdout)
    assert len(rows) == 5 and {r["trigger"] for r in rows} <= {"Forward", "OpenBucket"}
    res = rollups_cli.invoke(main, ["jobs", "energy_hourly", "--lane", "all", "--format", "json"])
    assert len(json.loads(res.stdout)) == 50
    res = rollups_cli.invoke(main, ["jobs", "energy_hourly", "--limit", "0"])
    assert res.exit_code == 2 and "--limit" in res.stderr


def test_the_last_recompute_failure_and_its_reason_show_in_the_health_fields() -> None:
    catalog = load_catalog()
    states = {"energy_hourly": ArchiveState("energy_hourly", status=ArchiveStatus.ACTIVATED)}
    t0 = NOW - 10 * H
    failed = Job(
        "energy_hourly",
        Trigger.PERIODIC,
        HOUR,
        state=JobState.FAILED,
        error="run abc ended before the job completed (Running)",
        created_at=t0,
        started_at=t0,
        finished_at=t0 + H,
    )
    older_failure = Job(
        "energy_hourly",
        Trigger.MANUAL,
        HOUR,
        state=JobState.FAILED,
        error="an older failure",
        created_at=t0 - 5 * H,
        finished_at=t0 - 4 * H,
    )
    forward_failure = Job(
        "energy_hourly",
        Trigger.FORWARD,
        HOUR,
        state=JobState.FAILED,
        error="forward lanes are not recomputes",
        created_at=t0 + 3 * H,
        finished_at=t0 + 4 * H,
    )
    succeeded = Job(
        "energy_hourly",
        Trigger.CHAIN,
        HOUR,
        state=JobState.COMPLETED,
        created_at=t0 + 2 * H,
        started_at=t0 + 2 * H,
        finished_at=t0 + 3 * H,
    )
    h = health(catalog, "energy_hourly", fold([older_failure, failed, forward_failure]), states)
    assert h.last_recompute_failure_at == t0 + H
    assert h.last_recompute_failure_reason == failed.error
    assert h.last_recompute_success_at is None and not h.recompute_in_progress

    running = Job("energy_hourly", Trigger.MANUAL, HOUR, state=JobState.RUNNING, created_at=NOW)
    later = fold([older_failure, failed, forward_failure, succeeded, running])
    h = health(catalog, "energy_hourly", later, states)
    # A later success does not clear the failure fields; it sets its own.
    assert h.last_recompute_failure_reason == failed.error
    assert h.last_recompute_success_at == t0 + 3 * H
    assert h.last_recompute_started_at == t0 + 2 * H and h.recompute_in_progress
