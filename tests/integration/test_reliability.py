"""Faults and operator actions forced into the windows where they used to lose or double-count a
correction (R1-R9 of the reliability review): each ordering is forced deterministically, by
running the other action at a point the first one reaches, never by timing.

A chain of three meters over three days is backfilled once per module and copied per test;
corrections land on meter-0001. After each scenario the sensors run until quiet and every level
is compared with the pandas oracle of the raw data; no pointer may name a generation without
rows for a cell the raw data gives a value.
"""

from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pandas as pd
import pyarrow as pa
import pytest
import yaml
from dagster._core.errors import DagsterExecutionInterruptedError
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.table import TableOptimizer

import rollup_assets.resources.spark_ingest as spark_ingest
import rollup_assets.services.columns as columns
import rollup_assets.services.forward as forward
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.column_rules import ColumnAction
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource, JobState, Lane, Trigger
from rollup_assets.model.partials import SPARES
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import tick, tick_until_quiet
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.ledger import Ledger
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.columns import change_column, column_states
from rollup_assets.services.engine import Engine
from rollup_assets.services.maintenance import fold_jobs, maintain
from rollup_assets.services.retention import apply_retention
from rollup_assets.settings import DEFAULT_SPECS
from tests.conftest import World, days
from tests.exactly_once import dangling_pointers
from tests.integration.test_crash_points import open_world, template_root, world_copy
from tests.oracle import compare_all

NOW = datetime(2025, 6, 10, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 2)  # a Monday
DAYS = 3
METER = "meter-0001"
OTHER = "meter-0002"
HOURLY = "energy_hourly"
H = timedelta(hours=1)
VIENNA = ZoneInfo("Europe/Vienna")


def midnight(d: date) -> datetime:
    return datetime(d.year, d.month, d.day, tzinfo=UTC)


def loaded(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=17) for d in days(FIRST, DAYS)]))
    world.activate_all(NOW)
    start = midnight(FIRST)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []


def build_loaded(root: Path) -> None:
    world = open_world(root)
    try:
        loaded(world)
    finally:
        world.instance.dispose()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, spark) -> Path:
    return template_root(tmp_path_factory, "reliability-template", build_loaded)


@pytest.fixture
def chain(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A copy of the backfilled chain."""
    yield from world_copy(template, tmp_path, monkeypatch)


def readings(entity: str, hour: datetime, value: float) -> pa.Table:
    """Four readings of `entity` in the hour starting at `hour`, each `value` kWh."""
    return pa.Table.from_pylist(
        [
            {"entity_id": entity, "ts": hour + timedelta(minutes=15 * i), "energy_kwh": value}
            for i in range(4)
        ]
    )


def settled(world: World) -> None:
    """The sensors run until quiet; then every level equals the oracle and no cell points at a
    generation without rows."""
    world.tick(NOW)
    raw = world.raw()
    assert compare_all(world.query, raw, world.catalog) == []
    for spec in world.catalog.rollups.values():
        assert dangling_pointers(world.engine, spec, raw) == []
    open_jobs = [j for j in world.engine.ledger.snapshot().jobs.values() if not j.state.terminal]
    assert open_jobs == []


def hour_value(world: World, hour: datetime, entity: str = METER) -> float | None:
    rows = world.query(HOURLY, start=hour, end=hour + H, entities=[entity])
    return rows["energy_kwh_sum"][0].as_py() if rows.num_rows else None


def failed_runs(reports: list) -> list[str]:
    return [f"{r.job_name}: {r.error}" for rep in reports for r in rep.runs if not r.success]


def once(action):
    """A wrapper for a store method: `action()` runs right before the first call, then the
    method runs as it would."""

    def wrap(method):
        fired: list[bool] = []

        def wrapper(*args, **kwargs):
            if not fired:
                fired.append(True)
                action()
            return method(*args, **kwargs)

        wrapper.fired = fired  # type: ignore[attr-defined]
        return wrapper

    return wrap


# -- R1, R2 --------------------------------------------------------------------------------------


def test_r1_a_rewind_between_a_recompute_check_and_its_flip_fails_the_flip(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    before_point, after_point = midnight(FIRST) + 10 * H, midnight(FIRST) + 34 * H
    rewind_to = midnight(FIRST + timedelta(days=1))  # between the two corrected hours
    world.ingest(
        pa.concat_tables([readings(METER, before_point, 3.0), readings(METER, after_point, 5.0)]),
        source="Manual",
    )

    def rewind() -> None:
        world.ops.rewind(HOURLY, rewind_to)

    # The rewind lands after the recompute checked that its buckets are still its own, right
    # before its flip: it drops the pointers and the recomputed rows from `rewind_to` on.
    flip = once(rewind)(RollupStore.flip)
    monkeypatch.setattr(RollupStore, "flip", flip)
    reports = tick_until_quiet(world.defs, world.instance, NOW)
    assert flip.fired
    settled(world)  # no cell vanished: every level equals the oracle
    assert hour_value(world, before_point) == pytest.approx(12.0)
    assert hour_value(world, after_point) == pytest.approx(20.0)
    # The flip failed (the rewind moved the fence), and the stopped job was queued again for
    # its part before the rewind point only (the forward lane aggregated the rest again).
    assert any("fence moved" in f for f in failed_runs(reports)), failed_runs(reports)
    jobs = world.engine.ledger.history(HOURLY)
    [stopped] = [j for j in jobs if j.state is JobState.FAILED and j.trigger is Trigger.PERIODIC]
    [retry] = [j for j in jobs if j.attempt == 2]
    assert all(w.end <= rewind_to for w in retry.windows) and retry.windows
    assert any(w.start >= rewind_to for w in stopped.windows)


def test_r1_a_new_formulas_recompute_stopped_by_a_rewind_is_queued_again_before_the_point(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new formula's recompute names every closed bucket as one range: stopped by a rewind
    inside that range, its buckets before the rewind point are queued again (the forward lane
    aggregates the rest), not dropped with the range."""
    world = chain
    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    doc["raw_archives"]["energy_raw"]["columns"]["current_a"]["formula"] = (
        "power_kw * 1000 / voltage_v * 2"
    )
    engine = Engine(parse_catalog(doc, origin="changed"), Warehouse(world.engine.warehouse.root))
    change_column(engine, "energy_raw", "current_a", ColumnAction.SET_FORMULA)
    rewind_to = midnight(FIRST + timedelta(days=1))

    def rewind() -> None:
        world.ops.rewind(HOURLY, rewind_to)

    flip = once(rewind)(RollupStore.flip)
    monkeypatch.setattr(RollupStore, "flip", flip)
    reports = tick_until_quiet(world.defs, world.instance, NOW)
    assert flip.fired
    assert any("fence moved" in f for f in failed_runs(reports)), failed_runs(reports)
    [retry] = [j for j in world.engine.ledger.history(HOURLY) if j.attempt == 2]
    assert max(w.end for w in retry.windows) == rewind_to
    world.tick(NOW)
    raw = world.raw()
    raw["current_a"] = raw["current_a"] * 2  # the oracle's frame computes the old formula
    assert compare_all(world.query, raw, world.catalog) == []  # every level: the new formula
    assert [j for j in world.engine.ledger.snapshot().jobs.values() if not j.state.terminal] == []


def test_r1_a_rollup_deleted_and_created_again_during_a_recompute_gets_none_of_its_rows(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every level is deleted and created again (activated, not yet filled) between a
    recompute's file writes and its commit: the commit must not land in the new table (its files
    were deleted with the old one, so every read of the new table would fail), and the flip must
    not install pointers there. Filled again, every level equals the oracle."""
    world = chain
    world.ingest(readings(METER, midnight(FIRST) + 10 * H, 3.0), source="Manual")
    names = [*reversed(list(world.catalog.rollups)), "energy_raw"]

    def recreate() -> None:
        for name in names:
            world.ops.disable(name)
            world.ops.delete(name)
        world.ops.activate("energy_raw", now=NOW)
        world.ingest(pa.concat_tables([day_batch(d, 3, seed=17) for d in days(FIRST, DAYS)]))
        world.activate_all(NOW)

    commit = once(recreate)(RollupStore.commit_generation)
    monkeypatch.setattr(RollupStore, "commit_generation", commit)
    reports = tick_until_quiet(world.defs, world.instance, NOW)
    assert commit.fired
    for spec in world.catalog.rollups.values():
        table = open_table(world.engine.rollups.uri(spec))
        files = table.file_uris() if table is not None else []
        missing = [f for f in files if not Path(f.removeprefix("file://")).exists()]
        assert missing == [], (spec.name, missing)
    assert any("deleted" in f for f in failed_runs(reports)), failed_runs(reports)
    start = midnight(FIRST)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    settled(world)


def test_r2_a_failed_recompute_is_retried_until_the_correction_lands(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    hour = midnight(FIRST) + 30 * H
    world.ingest(readings(METER, hour, 2.0), source="Manual")

    def storage_error() -> None:
        raise OSError("transient storage error")

    flip = once(storage_error)(RollupStore.flip)
    monkeypatch.setattr(RollupStore, "flip", flip)
    reports = tick_until_quiet(world.defs, world.instance, NOW)
    assert any("transient storage error" in f for f in failed_runs(reports))
    settled(world)
    assert hour_value(world, hour) == pytest.approx(8.0)
    failed = [j for j in world.engine.ledger.history(HOURLY) if j.state is JobState.FAILED]
    assert len(failed) == 1 and not failed[0].gave_up and "retried as" in (failed[0].error or "")


# -- R3, R4, R5: rollback ------------------------------------------------------------------------


@pytest.fixture
def kept(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A copy of the backfilled chain that keeps superseded generations for a week (rollbacks
    are possible)."""
    yield from world_copy(template, tmp_path, monkeypatch, retention_hours=168)


def correction_job(world: World, entity: str, hour: datetime, value: float):
    since = datetime.now(UTC)
    world.ingest(readings(entity, hour, value), source="Manual")
    world.tick(NOW)
    [job] = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if j.created_at >= since and j.state is JobState.COMPLETED and j.windows_processed
    ]
    return job


def with_hour(raw: pd.DataFrame, entity: str, hour: datetime, value: float) -> pd.DataFrame:
    """`raw` with the four readings of `entity` in `hour` at `value` kWh each: the raw data as a
    rollback of a later correction of that hour gives it back to the rollups."""
    out = raw.copy()
    ts = pd.to_datetime(out["ts"], utc=True)
    at = (out["entity_id"] == entity) & (ts >= pd.Timestamp(hour)) & (ts < pd.Timestamp(hour + H))
    out.loc[at, "energy_kwh"] = value
    return out


def test_r3_a_reclaim_keeps_what_a_newer_flip_superseded_for_its_rollback(
    kept: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = kept
    hour = midnight(FIRST) + 20 * H
    correction_job(world, METER, hour, 1.0)  # job A: the cell's first correction
    second = correction_job(world, METER, hour, 6.0)  # job B
    correction_job(world, OTHER, hour + H, 9.0)  # another recompute: its reclaim runs
    assert hour_value(world, hour) == pytest.approx(24.0)
    out = world.ops.rollback(HOURLY, second.job_id)
    assert out.job.state is JobState.COMPLETED
    assert hour_value(world, hour) == pytest.approx(4.0)  # A's values, read back exactly
    world.tick(NOW)
    expected = with_hour(world.raw(), METER, hour, 1.0)
    assert compare_all(world.query, expected, world.catalog) == []
    for spec in world.catalog.rollups.values():
        assert dangling_pointers(world.engine, spec, expected) == []


def test_r4_a_reclaim_between_a_rollback_check_and_its_commit_keeps_its_rows(
    kept: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = kept
    hour = midnight(FIRST) + 20 * H
    correction_job(world, METER, hour, 1.0)
    second = correction_job(world, METER, hour, 6.0)

    def another_recompute() -> None:
        # A run of another cell: its reclaim runs while the rollback has checked its rows.
        world.ingest(readings(OTHER, hour + H, 9.0), source="Manual")
        key = f"{(hour + H).astimezone(VIENNA):%Y-%m-%d-%H:00}"
        run = world.materialize(HOURLY, key, key)
        assert run.success, run.error

    restore = once(another_recompute)(RollupStore.restore_pointers)
    monkeypatch.setattr(RollupStore, "restore_pointers", restore)
    world.ops.rollback(HOURLY, second.job_id)
    assert restore.fired
    assert hour_value(world, hour) == pytest.approx(4.0)  # never an empty cell
    world.tick(NOW)
    expected = with_hour(world.raw(), METER, hour, 1.0)
    assert compare_all(world.query, expected, world.catalog) == []
    for spec in world.catalog.rollups.values():
        assert dangling_pointers(world.engine, spec, expected) == []


def test_r5_a_rollback_whose_record_was_lost_is_completed_by_running_it_again(
    kept: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = kept
    hour = midnight(FIRST) + 20 * H
    correction_job(world, METER, hour, 1.0)
    raw_after_a = world.raw()
    second = correction_job(world, METER, hour, 6.0)
    record = Ledger.record
    lost: list[bool] = []

    def crash_on_completion(self, jobs=(), *args, **kwargs):
        done = [j for j in jobs if j.trigger is Trigger.ROLLBACK and j.state is JobState.COMPLETED]
        if done and not lost:
            lost.append(True)
            raise RuntimeError("process died after the rollback's pointer commit")
        return record(self, jobs, *args, **kwargs)

    monkeypatch.setattr(Ledger, "record", crash_on_completion)
    with pytest.raises(RuntimeError, match="process died"):
        world.ops.rollback(HOURLY, second.job_id)
    assert hour_value(world, hour) == pytest.approx(4.0)  # the pointers went back
    # The same command again completes it (its effect landed); it is not refused.
    out = world.ops.rollback(HOURLY, second.job_id)
    assert out.job.state is JobState.COMPLETED and out.undone.job_id == second.job_id
    assert out.propagated, "the levels above are queued"
    world.tick(NOW)
    assert compare_all(world.query, raw_after_a, world.catalog) == []


def test_r5_an_interrupted_rollback_is_recovered_by_the_sensor(
    kept: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollup_assets import faults
    from rollup_assets.model.intents import STALE_AFTER

    world = kept
    hour = midnight(FIRST) + 20 * H
    correction_job(world, METER, hour, 1.0)
    raw_after_a = world.raw()
    second = correction_job(world, METER, hour, 6.0)

    def die(point: str, archive: str | None) -> None:
        if point == "rollback_commit":
            raise KeyboardInterrupt("killed")

    with faults.hooked(die), pytest.raises(KeyboardInterrupt):
        world.ops.rollback(HOURLY, second.job_id)
    [left] = [j for j in world.engine.ledger.history(HOURLY) if j.trigger is Trigger.ROLLBACK]
    assert left.state is JobState.SWAPPING
    # Once the rollback is stale, the sensor finishes it: completed, the levels above queued.
    aged = replace(left, started_at=left.started_at - STALE_AFTER - H)
    world.engine.ledger.record([aged.next()])
    world.tick(NOW)
    done = world.engine.ledger.job(left.job_id)
    assert done.state is JobState.COMPLETED
    assert compare_all(world.query, raw_after_a, world.catalog) == []


# -- R6: retention and ingest --------------------------------------------------------------------


def test_r6_an_ingest_racing_retention_is_refused_not_counted_twice(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    hour = midnight(FIRST) + 10 * H
    world.ingest(readings(METER, hour, 1.0), source="Manual")
    world.tick(NOW)
    assert hour_value(world, hour) == pytest.approx(4.0)
    retention = world.catalog.raw["energy_raw"].retention
    assert retention is not None
    # The first day is past the horizon at this instant; the other two are kept.
    at = midnight(FIRST + timedelta(days=1)) + retention + 10 * H

    def retention_pass() -> None:
        [outcome] = apply_retention(world.engine, at)
        assert outcome.days == (FIRST,), outcome

    merge = once(retention_pass)(DeltaTable.merge)
    monkeypatch.setattr(DeltaTable, "merge", merge)
    with pytest.raises(IngestValidationError, match="retention has dropped those days"):
        world.ingest(readings(METER, hour, 5.0), source="Manual")
    assert merge.fired
    kept_from = world.engine.states.get("energy_raw").retained_from
    assert kept_from == midnight(FIRST + timedelta(days=1))
    assert (world.raw()["ts"] < pd.Timestamp(kept_from)).sum() == 0
    world.tick(NOW)
    assert hour_value(world, hour) == pytest.approx(4.0)  # what it aggregated; never 24


def test_r6_a_spark_ingest_checks_retention_on_the_snapshot_it_merges_into(
    chain: World, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    """The Spark ingest's counterpart: a retention pass that commits after the batch was
    validated (against the boundary its caller read) and before the MERGE reads the table; the
    batch is refused on the snapshot it would merge into, and nothing is written."""
    world = chain
    hour = midnight(FIRST) + 10 * H
    world.tick(NOW)
    retention = world.catalog.raw["energy_raw"].retention
    assert retention is not None
    at = midnight(FIRST + timedelta(days=1)) + retention + 10 * H
    spec = world.catalog.raw["energy_raw"]
    version = world.engine.raw.table(spec).version()

    def retention_pass() -> None:
        [outcome] = apply_retention(world.engine, at)
        assert outcome.days == (FIRST,), outcome

    validate = once(retention_pass)(spark_ingest.validate_frame)
    monkeypatch.setattr(spark_ingest, "validate_frame", validate)
    frame = spark.createDataFrame(readings(METER, hour, 5.0).to_pandas())
    with pytest.raises(IngestValidationError, match="retention has dropped those days"):
        spark_ingest.ingest_frame(
            world.engine.raw,
            spark,
            spec,
            frame,
            ChangeSource.MANUAL,
            not_before=world.engine.states.get("energy_raw").retained_from,
        )
    assert validate.fired
    kept_from = world.engine.states.get("energy_raw").retained_from
    assert kept_from == midnight(FIRST + timedelta(days=1))
    assert (world.raw()["ts"] < pd.Timestamp(kept_from)).sum() == 0
    since = [c for c in world.engine.raw.table(spec).history() if c["version"] > version]
    assert [c for c in since if c.get("rollups.operation") == "ingest"] == []
    world.tick(NOW)
    assert hour_value(world, hour) is not None


# -- R7: computed column change ------------------------------------------------------------------


def test_r7_a_column_change_killed_after_its_switch_is_recomputed_and_finished(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sensors finish an intent left longer than a minute; on a slow machine the ticks
    # below outlast that, and this test is about the command run again, so the intent is never
    # stale here (the sensor finishing one: test_r5_an_interrupted_rollback_is_recovered_by_the_
    # sensor, and the stateful test's kills).
    monkeypatch.setattr("rollup_assets.model.intents.STALE_AFTER", timedelta(days=1))
    world = chain
    before = world.query("energy_daily")["current_a_max"].to_pylist()
    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    doc["raw_archives"]["energy_raw"]["columns"]["current_a"]["formula"] = (
        "power_kw * 1000 / voltage_v * 2"
    )
    changed = parse_catalog(doc, origin="changed")
    engine = Engine(changed, Warehouse(world.engine.warehouse.root))

    def die() -> None:
        raise KeyboardInterrupt("killed after the switch")

    refresh = once(die)(columns.refresh_inserted)
    monkeypatch.setattr(columns, "refresh_inserted", refresh)
    with pytest.raises(KeyboardInterrupt):
        change_column(engine, "energy_raw", "current_a", ColumnAction.SET_FORMULA)
    [state] = [s for s in column_states(engine, "energy_raw") if s.column == "current_a"]
    assert state.status == "active"  # the switch landed
    # The sensors queue the recompute from the switch commit itself.
    world.tick(NOW)
    after = world.query("energy_daily")["current_a_max"].to_pylist()
    assert after == pytest.approx([b * 2 for b in before], rel=1e-9)
    assert engine.states.get("energy_raw").intent is not None  # the change is unfinished
    # The same command again finishes the change; it is not refused.
    result = change_column(engine, "energy_raw", "current_a", ColumnAction.SET_FORMULA)
    assert result.column == "current_a" and result.action is ColumnAction.SET_FORMULA
    assert engine.states.get("energy_raw").intent is None


# -- R8: maintenance -----------------------------------------------------------------------------


def test_r8_maintenance_goes_on_past_a_compaction_that_keeps_losing_its_race(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    compact = TableOptimizer.compact

    def losing(self, *args, **kwargs):
        if self.table.table_uri.rstrip("/").endswith("energy_raw"):
            raise CommitFailedError("a concurrent transaction deleted data this operation read")
        return compact(self, *args, **kwargs)

    monkeypatch.setattr(TableOptimizer, "compact", losing)
    report = maintain(world.engine, now=NOW)
    assert [f.split(":")[0:2] for f in report.failures] == [["energy_raw", " compaction"]]
    # Every other table was kept: compacted, vacuumed and checkpointed.
    for spec in world.catalog.rollups.values():
        log = Path(world.engine.rollups.uri(spec)) / "_delta_log"
        assert (log / "_last_checkpoint").exists(), spec.name
    assert (Path(world.engine.raw.uri(world.catalog.raw["energy_raw"])) / "_delta_log").exists()
    settled(world)


# -- R9: a forward run stopped by Dagster ----------------------------------------------------------


def test_r9_a_forward_run_stopped_by_dagster_records_its_failure_and_releases_its_claim(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.activate_all(NOW)
    world.ingest(readings(METER, NOW, 1.0))

    real, stopped = forward.checkpoint, []

    def stopping(point: str, *args: object) -> None:
        # Dagster stops the run once it has claimed its buckets, before it writes anything.
        if point == "after_claim" and not stopped:
            stopped.append(point)
            raise DagsterExecutionInterruptedError("the run was terminated")
        real(point, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(forward, "checkpoint", stopping)
    later = NOW + 3 * H
    report = tick(world.defs, world.instance, later, sensors=("forward_aggregation_sensor",))
    assert stopped and any(not r.success for r in report.runs)
    jobs = world.engine.ledger.history(HOURLY, lane=Lane.FORWARD)
    assert jobs and jobs[0].state is JobState.FAILED
    assert "terminated" in (jobs[0].error or "")
    assert world.engine.states.get(HOURLY).claimed_until is None
    world.tick(later)
    assert hour_value(world, NOW) == pytest.approx(4.0)


# -- Found by the model test ---------------------------------------------------------------------


def lowest_voltages(world: World, entity: str, n: int, within: Window | None = None) -> pa.Table:
    """`entity`'s `n` readings of lowest voltage (in `within`, if given), raised to its median
    voltage there."""
    raw = world.raw()
    if within is not None:
        raw = raw[(raw["ts"] >= within.start) & (raw["ts"] < within.end)]
    mine = raw[(raw["entity_id"] == entity) & raw["voltage_v"].notna()]
    low = mine.nsmallest(n, "voltage_v")[["entity_id", "ts", "energy_kwh", "power_kw"]]
    low = low.assign(voltage_v=float(mine["voltage_v"].median()))
    return pa.Table.from_pandas(low, preserve_index=False)


def test_a_recompute_rewrites_a_cell_whose_kept_extremes_all_left(chain: World) -> None:
    """The lowest voltages a week's cell keeps all left it (raised by corrections): a read of
    the cell aggregates it again from the level below. A reading then changed reaches that
    level through recomputes (an operator's, before the sensors' correction): the week's
    recompute must write the cell, though a read of it already shows the new value. It
    compared with that read, found nothing changed and kept rows without the change, which a
    new lowest reading (the minimum known again) then brought to light."""
    world = chain
    world.ingest(lowest_voltages(world, METER, SPARES + 2), source="Manual")
    settled(world)

    hour = datetime(2025, 6, 3, 9, tzinfo=UTC)
    since = datetime.now(UTC)
    world.ingest(readings(METER, hour, 5.0), source="Manual")
    world.ops.request_recompute(HOURLY, hour, hour + H, frozenset({METER}))
    world.tick(NOW)
    weekly = [
        j
        for j in world.engine.ledger.history("energy_weekly")
        if j.created_at >= since and j.state is JobState.COMPLETED
    ]
    # The change reached the week as an aggregation from the level below, not as a difference.
    assert [(j.trigger, j.corrects, j.cells_changed) for j in weekly] == [(Trigger.CHAIN, False, 1)]

    low = {"entity_id": METER, "ts": hour + timedelta(minutes=5), "energy_kwh": 1.0}
    lowest = pa.Table.from_pylist([{**low, "voltage_v": 150.0}])
    world.ingest(lowest, source="Manual")
    settled(world)


def test_a_fold_meeting_a_cell_it_cannot_know_does_not_count_a_change_twice(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fold rewrites a day whose cell lost every kept lowest voltage: a read aggregates that
    cell again from the hours. A change reaches the hours while the fold runs, and its
    correction of the day waits for the fold. The fold must not take the change into the day
    as well."""
    from rollup_assets import faults

    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", 1)
    world = chain
    day = datetime(2025, 6, 2, 22, tzinfo=UTC)  # the Vienna day 2025-06-03
    low = lowest_voltages(world, METER, SPARES + 2, Window(day, day + 24 * H))
    world.ingest(low, source="Manual")
    settled(world)

    # The days' fold alone (a fold of the hours would hold their slot, which the change needs).
    others = set(world.catalog.rollups) - {"energy_daily"}
    folds = fold_jobs(world.engine, others, NOW)
    assert [j.rollup for j in folds] == ["energy_daily"]
    world.engine.ledger.record(folds)
    hour = day + 10 * H
    fired: list[bool] = []

    def change_the_hours(point: str, archive: str | None) -> None:
        if point == "before_correct" and archive == "energy_daily" and not fired:
            fired.append(True)
            world.ingest(readings(METER, hour, 5.0), source="Manual")
            tick_until_quiet(world.defs, world.instance, NOW)

    with faults.hooked(change_the_hours):
        tick_until_quiet(world.defs, world.instance, NOW)
    assert fired
    settled(world)
    # The cell was aggregated again by a job that records the source version it read.
    refreshed = [
        j
        for j in world.engine.ledger.history("energy_daily")
        if j.trigger is Trigger.REFRESH and j.state is JobState.COMPLETED
    ]
    assert [(j.entities, j.read_version is not None) for j in refreshed] == [
        (frozenset({METER}), True)
    ]


def test_a_recompute_reading_a_cell_below_it_cannot_know_waits_for_its_refresh(
    chain: World,
) -> None:
    """A day's cell lost every kept lowest voltage: a read aggregates it again from the hours.
    A change reaches the hours, and its correction of the day is under way when an operator's
    recompute of the week reads the day. The week must not take the change from the hours
    through that cell (ahead of the day's version it records) and then again from the day's
    correction: it waits for the day's cell to be refreshed. (The months, which read the days
    too, are disabled meanwhile: their open bucket would refresh the cell first.)"""
    from rollup_assets import faults

    world = chain
    world.ops.disable("energy_monthly")
    day = datetime(2025, 6, 2, 22, tzinfo=UTC)  # the Vienna day 2025-06-03
    week = datetime(2025, 6, 1, 22, tzinfo=UTC)  # its ISO week
    low = lowest_voltages(world, METER, SPARES + 2, Window(day, day + 24 * H))
    world.ingest(low, source="Manual")
    world.tick(NOW)
    since = datetime.now(UTC)
    fired: list[bool] = []

    def recompute_the_week(point: str, archive: str | None) -> None:
        if point == "before_correct" and archive == "energy_daily" and not fired:
            fired.append(True)
            world.ops.request_recompute(
                "energy_weekly", week, week + 7 * 24 * H, frozenset({METER})
            )
            tick_until_quiet(world.defs, world.instance, NOW)

    world.ingest(readings(METER, day + 10 * H, 5.0), source="Manual")
    with faults.hooked(recompute_the_week):
        tick_until_quiet(world.defs, world.instance, NOW)
    assert fired
    world.ops.enable("energy_monthly", now=NOW)
    settled(world)
    waited = [
        j
        for j in world.engine.ledger.history("energy_weekly")
        if j.created_at >= since and "waits for a refresh" in (j.plan or "")
    ]
    assert [(j.trigger, j.windows_processed) for j in waited] == [(Trigger.MANUAL, 0)]
    refreshed = [
        j
        for j in world.engine.ledger.history("energy_daily")
        if j.created_at >= since and j.trigger is Trigger.REFRESH
    ]
    assert [(j.state, j.entities) for j in refreshed] == [(JobState.COMPLETED, frozenset({METER}))]


@pytest.fixture
def one_attempt(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A copy of the backfilled chain whose work gets one attempt: a job that cannot finish ends
    Failed at once."""
    yield from world_copy(template, tmp_path, monkeypatch, retry_attempts=1)


def test_a_job_that_gives_up_behind_a_refresh_fails_its_dagster_run(one_attempt: World) -> None:
    """The scenario above with one attempt: the week's job meets the day's cell it cannot know
    and, its attempts spent, ends Failed for good without raising. Its Dagster run must fail
    too, naming the job and why, not read as a success in the UI and to alerts."""
    from rollup_assets import faults

    world = one_attempt
    world.ops.disable("energy_monthly")
    day = datetime(2025, 6, 2, 22, tzinfo=UTC)
    week = datetime(2025, 6, 1, 22, tzinfo=UTC)
    low = lowest_voltages(world, METER, SPARES + 2, Window(day, day + 24 * H))
    world.ingest(low, source="Manual")
    world.tick(NOW)
    since = datetime.now(UTC)
    reports: list = []

    def recompute_the_week(point: str, archive: str | None) -> None:
        if point == "before_correct" and archive == "energy_daily" and not reports:
            world.ops.request_recompute(
                "energy_weekly", week, week + 7 * 24 * H, frozenset({METER})
            )
            reports.extend(tick_until_quiet(world.defs, world.instance, NOW))

    world.ingest(readings(METER, day + 10 * H, 5.0), source="Manual")
    with faults.hooked(recompute_the_week):
        tick_until_quiet(world.defs, world.instance, NOW)
    assert reports
    [given_up] = [
        j
        for j in world.engine.ledger.history("energy_weekly")
        if j.created_at >= since and j.gave_up
    ]
    assert (given_up.error or "").startswith("gave up after 1 attempt(s)")
    failures = failed_runs(reports)
    assert any(
        given_up.job_id in f and "ended Failed for good: gave up after 1 attempt(s)" in f
        for f in failures
    ), failures


def test_a_recompute_empties_a_cell_it_cannot_know_whose_source_rows_all_went(
    chain: World,
) -> None:
    """A day's cell lost every kept lowest voltage, then every reading of its meter that day is
    deleted. An operator's recompute of the day runs before the deletion's correction reaches
    the day: it must empty the cell (its rows cannot say what they hold, the hours hold
    nothing), not find no cell on either side and change nothing while the correction it
    claims to hold is skipped; the week would keep the day's old energy."""
    from rollup_assets import faults

    world = chain
    world.ops.disable("energy_monthly")  # its open bucket would refresh the cell (see above)
    day = datetime(2025, 6, 2, 22, tzinfo=UTC)  # the Vienna day 2025-06-03
    low = lowest_voltages(world, METER, SPARES + 2, Window(day, day + 24 * H))
    world.ingest(low, source="Manual")
    world.tick(NOW)
    fired: list[bool] = []

    def recompute_the_day(point: str, archive: str | None) -> None:
        if point == "after_flip" and archive == HOURLY and not fired:
            fired.append(True)
            world.ops.request_recompute("energy_daily", day, day + 24 * H, frozenset({METER}))
            tick_until_quiet(world.defs, world.instance, NOW)

    world.engine.raw.delete_rows(
        world.catalog.raw["energy_raw"],
        Window(day, day + 24 * H),
        frozenset({METER}),
        ChangeSource.MANUAL,
        retention=False,
    )
    with faults.hooked(recompute_the_day):
        tick_until_quiet(world.defs, world.instance, NOW)
    assert fired
    manual = [j for j in world.engine.ledger.history("energy_daily") if j.trigger is Trigger.MANUAL]
    assert [(j.state, j.cells_changed) for j in manual] == [(JobState.COMPLETED, 1)]
    world.ops.enable("energy_monthly", now=NOW)
    settled(world)
