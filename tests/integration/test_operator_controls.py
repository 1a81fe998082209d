"""Operator controls, archive lifecycle and job history (issue 5), with a pinned clock.

Worlds are small (two meters, a few local days) and activate only the levels a rule needs; the
whole-chain rules (scoped manual recompute, rewind) share one module-scoped world.
"""

import contextlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import yaml
from click.testing import CliRunner

import rollup_assets.cli.progress as progress
from rollup_assets.assembly import build_definitions
from rollup_assets.cli import app as cli
from rollup_assets.demo.sample_data import SCHEMA
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    ArchiveSchemaImmutableError,
    InvalidArchiveStateTransitionError,
    InvalidTimeRangeError,
    RollupSourceInUseError,
    RollupSourceMissingError,
)
from rollup_assets.model.jobs import Job, JobState, Lane, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.health import health
from rollup_assets.services.operations import Operations
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import DEFAULT_SPECS, Settings
from tests.conftest import World, instance_in
from tests.oracle import compare, compare_all, oracle
from tests.unit.test_progress import Terminal

H = timedelta(hours=1)
Q = timedelta(minutes=15)
NOW = datetime(2025, 6, 10, 6, 30, tzinfo=UTC)  # Tuesday 08:30 in Vienna (CEST, UTC+2)
DAY_09 = Window(datetime(2025, 6, 8, 22, tzinfo=UTC), datetime(2025, 6, 9, 22, tzinfo=UTC))
DAY_10 = Window(DAY_09.end, DAY_09.end + 24 * H)
LATE_HOUR = Window(datetime(2025, 6, 9, 10, tzinfo=UTC), datetime(2025, 6, 9, 11, tzinfo=UTC))
METERS = ("m1", "m2")
HOURLY, DAILY, WEEKLY = "energy_hourly", "energy_daily", "energy_weekly"


def readings(start: datetime, end: datetime, scale: float = 1.0, meters=METERS) -> pa.Table:
    """15-minute readings in [start, end); values vary by slot so sums, mins and maxes differ."""
    rows, t = [], start
    while t < end:
        k = int(t.timestamp() // 900)
        for i, m in enumerate(meters):
            rows.append(
                {
                    "entity_id": m,
                    "ts": t,
                    "energy_kwh": scale * (1.0 + i + (k % 7) * 0.25),
                    "power_kw": scale * (2.0 + k % 5),
                    "voltage_v": 228.0 + (k % 3) + i,
                }
            )
        t += Q
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def build(world: World, levels: tuple[str, ...], start: datetime = DAY_09.start) -> None:
    """Raw readings from `start` up to NOW, the given levels activated at NOW, history backfilled
    and the forward lane caught up."""
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(readings(start, NOW), source="Import")
    for name in levels:
        world.ops.activate(name, now=NOW)
    world.backfill([Window(start, NOW)])
    world.tick(NOW)


def problems(world: World, levels: tuple[str, ...]) -> list[str]:
    raw = world.raw()
    out = []
    for name in levels:
        spec = world.catalog.rollup(name)
        out += compare(world.query(name), oracle(raw, spec), spec)
    return out


def stored_rows(world: World, name: str, until: datetime) -> list[tuple]:
    """Every stored row (all generations, with bookkeeping) of buckets ending at/before `until`."""
    snap = world.engine.rollups.snapshot(world.catalog.rollup(name))
    if snap.table is None:
        return []
    rows = pa.table(snap.table.to_pyarrow_table())
    rows = rows.filter(pc.less_equal(rows["bucket_end"], pa.scalar(until, rows["bucket_end"].type)))
    # Lists (a cell's kept extremes) and nulls do not compare: order by their text.
    return sorted((tuple(sorted(r.items())) for r in rows.to_pylist()), key=repr)


def pointers(world: World, name: str) -> list[dict]:
    spec = world.catalog.rollup(name)
    table, _ = read_pointers(world.engine.rollups.genmap_uri(spec))
    return table.to_pylist()


def jobs(world: World, name: str) -> list[Job]:
    return world.engine.ledger.history(name, limit=10_000)


def version(world: World, name: str) -> int | None:
    return world.engine.rollups.snapshot(world.catalog.rollup(name)).version


def runs_for(reports: list, rollup: str, lane: str | None = None) -> list:
    return [
        r
        for rep in reports
        for r in rep.runs
        if r.tags.get("rollups/rollup") == rollup and lane in (None, r.tags.get("rollups/lane"))
    ]


def late_write(world: World, hour: Window = LATE_HOUR, scale: float = 3.0) -> None:
    world.ingest(readings(hour.start, hour.end, scale, meters=("m1",)), source="Manual")


@contextlib.contextmanager
def cli_env(world: World) -> Iterator[CliRunner]:
    """The CLI pointed at `world` (its cached catalog/engine are reset on entry and exit)."""
    wh = str(world.engine.warehouse.root)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLUPS_WAREHOUSE", wh)
        mp.setenv("DAGSTER_HOME", str(world.instance.root_directory))
        cli.settings.cache_clear()
        cli.catalog.cache_clear()
        cli.engine.cache_clear()
        try:
            yield CliRunner()
        finally:
            cli.settings.cache_clear()
            cli.catalog.cache_clear()
            cli.engine.cache_clear()


# -- freeze / unfreeze --------------------------------------------------------------------------


def test_freeze_is_monotonic(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ops.activate(HOURLY, now=NOW)
    world.ops.freeze(HOURLY, DAY_10.start)
    with pytest.raises(InvalidArchiveStateTransitionError, match="monotonic"):
        world.ops.freeze(HOURLY, DAY_10.start - timedelta(microseconds=1))
    assert world.engine.states.get(HOURLY).frozen_until == DAY_10.start
    assert world.ops.freeze(HOURLY, DAY_10.start).frozen_until == DAY_10.start  # equal: fine
    assert world.ops.freeze(HOURLY, DAY_10.end).frozen_until == DAY_10.end
    assert world.ops.unfreeze(HOURLY).frozen_until is None
    # After an unfreeze a new freeze may start anywhere.
    assert world.ops.freeze(HOURLY, DAY_09.end).frozen_until == DAY_09.end


def test_a_late_write_into_a_frozen_range_waits_for_unfreeze(world: World) -> None:
    levels = (HOURLY, DAILY)
    build(world, levels)
    assert problems(world, levels) == []
    frozen_until = DAY_10.end  # covers the closed 2025-06-09 and the open 2025-06-10
    world.ops.freeze(DAILY, frozen_until)
    before = stored_rows(world, DAILY, frozen_until)
    frozen_at = datetime.now(UTC)

    late_write(world)  # retroactive for hourly, so a chain job for daily 06-09 follows
    world.ingest(readings(NOW, NOW + 2 * H))  # more of 06-10 (the daily open bucket)
    later = datetime(2025, 6, 10, 23, 0, tzinfo=UTC)  # past the end of 06-10: daily would close it
    reports = world.tick(later)

    assert runs_for(reports, HOURLY), "hourly is not frozen and must have run"
    assert problems(world, (HOURLY,)) == []
    # No path (forward close, open refresh, recompute, chain) wrote a frozen daily bucket ...
    assert stored_rows(world, DAILY, frozen_until) == before
    for job in jobs(world, DAILY):
        if job.created_at >= frozen_at and job.windows_processed:
            assert all(w.end > frozen_until for w in job.windows), job
    assert world.engine.states.get(DAILY).watermark == DAY_09.end
    # ... and the dirty day waits, visible as pending work.
    h = health(world.catalog, DAILY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.frozen_until == frozen_until
    assert h.dirty_windows_pending == 1
    assert h.pending_recompute_ranges == [DAY_09]
    pending = world.engine.ledger.snapshot().pending(DAILY)
    assert [j.trigger for j in pending] == [Trigger.CHAIN]

    state = world.ops.unfreeze(DAILY, accept_gaps=True)
    assert state.frozen_until is None and state.accept_gaps is True
    audit = world.engine.states.history(DAILY)[-1]
    assert audit.reason == "unfreeze (accept_gaps=true); released 1 held write(s)"
    assert audit.changed_by == "test"

    world.tick(later)
    assert problems(world, levels) == []
    assert world.engine.states.get(DAILY).watermark == DAY_10.end
    assert (
        health(
            world.catalog, DAILY, world.engine.ledger.snapshot(), world.engine.states.all()
        ).dirty_windows_pending
        == 0
    )
    done = world.engine.ledger.job(pending[0].job_id)
    assert done is not None and done.state in (JobState.COMPLETED, JobState.COALESCED)


# -- disable / enable / re-activation -----------------------------------------------------------


def test_disable_keeps_pending_work_and_enable_drains_it(world: World) -> None:
    build(world, (HOURLY,))
    queued = world.ops.request_recompute(HOURLY, LATE_HOUR.start, LATE_HOUR.end + H)
    running = Job(
        HOURLY,
        Trigger.PERIODIC,
        (LATE_HOUR,),
        state=JobState.RUNNING,
        started_at=datetime.now(UTC),
        generation=99,
    )
    world.engine.ledger.record([running])
    assert health(
        world.catalog, HOURLY, world.engine.ledger.snapshot(), world.engine.states.all()
    ).recompute_in_progress
    v0 = version(world, HOURLY)

    world.ops.disable(HOURLY)
    # The running job is stopped with the reason and its buckets are queued again; the pending
    # request waits: a disable loses no correction.
    stopped = world.engine.ledger.job(running.job_id)
    assert stopped is not None and stopped.state is JobState.FAILED
    assert stopped.error == "stopped: archive was disabled" and stopped.finished_at is not None
    kept = world.engine.ledger.job(queued.job_id)
    assert kept is not None and kept.state is JobState.PENDING
    requeued = [
        j for j in world.engine.ledger.snapshot().pending(HOURLY) if j.job_id != queued.job_id
    ]
    assert [(j.trigger, j.windows) for j in requeued] == [(Trigger.PERIODIC, (LATE_HOUR,))]
    h = health(world.catalog, HOURLY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.status == "Disabled" and not h.recompute_in_progress
    assert h.dirty_windows_pending == 2 and h.pending_recompute_ranges
    assert h.last_recompute_failure_reason == "stopped: archive was disabled"

    # A recompute of a disabled rollup fails fast with the reason, and writes nothing ...
    with pytest.raises(ArchiveNotActivatedError, match=r"not activated \(status Disabled\)"):
        world.ops.request_recompute(HOURLY, LATE_HOUR.start, LATE_HOUR.end)
    refused = jobs(world, HOURLY)[0]
    assert (refused.trigger, refused.state) == (Trigger.MANUAL, JobState.FAILED)
    assert "Archive is not activated (status Disabled)" in (refused.error or "")
    # ... also when launched as a Dagster run of the asset.
    run = world.materialize(HOURLY, "2025-06-09-10:00", "2025-06-09-10:00")
    assert not run.success and "not activated" in (run.error or "")
    by_run = [j for j in jobs(world, HOURLY) if j.run_id == run.run_id]
    assert [(j.trigger, j.state) for j in by_run] == [(Trigger.MANUAL, JobState.FAILED)]
    assert "status Disabled" in (by_run[0].error or "")

    # While disabled a late write is detected and waits; nothing runs for the rollup.
    late_write(world)
    reports = world.tick(NOW)
    assert runs_for(reports, HOURLY) == []
    assert version(world, HOURLY) == v0
    waiting = [
        j
        for j in world.engine.ledger.snapshot().pending(HOURLY)
        if j.job_id not in {queued.job_id, requeued[0].job_id}
    ]
    assert [(j.trigger, j.windows) for j in waiting] == [(Trigger.PERIODIC, (LATE_HOUR,))]
    with pytest.raises(ArchiveNotActivatedError):
        world.query(HOURLY)

    # Enabling resumes: the waiting job and new work drain on the next tick.
    assert world.ops.enable(HOURLY, now=NOW).status is ArchiveStatus.ACTIVATED
    late_write(world, Window(LATE_HOUR.start + 3 * H, LATE_HOUR.end + 3 * H), scale=5.0)
    reports = world.tick(NOW)
    assert runs_for(reports, HOURLY)
    assert version(world, HOURLY) != v0
    for job in (waiting[0], kept, requeued[0]):  # what waited, all of it, drained
        resumed = world.engine.ledger.job(job.job_id)
        assert resumed is not None and resumed.state in (JobState.COMPLETED, JobState.COALESCED)
    assert problems(world, (HOURLY,)) == []
    assert world.engine.ledger.snapshot().pending(HOURLY) == []


# -- coalescing and job history (Python and CLI) ------------------------------------------------


def test_overlapping_corrections_coalesce_and_job_history(world: World) -> None:
    build(world, (HOURLY,))
    forward = [
        j for j in jobs(world, HOURLY) if j.trigger in (Trigger.FORWARD, Trigger.OPEN_BUCKET)
    ]
    assert Trigger.FORWARD in {j.trigger for j in forward}
    assert all(j.state is JobState.COMPLETED and j.generation == 0 for j in forward)

    # Two overlapping corrections land before the sensor sees either.
    late_write(world, scale=2.0)
    late_write(world, Window(LATE_HOUR.start + 2 * Q, LATE_HOUR.end + 2 * Q), scale=3.0)
    reports = world.tick(NOW)
    assert len(runs_for(reports, HOURLY, lane="recompute")) == 1
    assert problems(world, (HOURLY,)) == []

    history = jobs(world, HOURLY)
    coalesced = [j for j in history if j.state is JobState.COALESCED]
    assert len(coalesced) == 2
    merged = world.engine.ledger.job(coalesced[0].coalesced_into or "")
    assert merged is not None and {j.coalesced_into for j in coalesced} == {merged.job_id}
    assert merged.trigger is Trigger.PERIODIC and merged.state is JobState.COMPLETED
    assert merged.windows == (Window(LATE_HOUR.start, LATE_HOUR.end + H),)
    assert merged.entities == frozenset({"m1"})
    assert merged.windows_processed == 2 and merged.rows_processed == 2
    assert merged.generation is not None and merged.generation > 0
    assert merged.started_at and merged.finished_at and merged.started_at <= merged.finished_at
    assert merged.duration_ms is not None and merged.error is None and merged.run_id
    assert all(j.source_archive == "energy_raw" and j.finished_at for j in coalesced)
    assert [j.created_at for j in history] == sorted((j.created_at for j in history), reverse=True)

    with cli_env(world) as runner:
        res = runner.invoke(cli.main, ["jobs", HOURLY, "--format", "json"])
        assert res.exit_code == 0, res.output
        rows = json.loads(res.stdout)
        # The job history is the recompute jobs (forward closes do not push them out).
        recomputes = [j for j in history if j.trigger.lane is Lane.RECOMPUTE]
        assert [r["job_id"] for r in rows] == [j.job_id for j in recomputes[:50]]
        listed = {r["job_id"]: r for r in rows}
        for job in coalesced:
            assert listed[job.job_id]["state"] == "Coalesced"
            assert listed[job.job_id]["coalesced_into"] == merged.job_id
        m = listed[merged.job_id]
        assert (m["trigger"], m["state"], m["windows"], m["rows"]) == (
            "Periodic",
            "Completed",
            2,
            2,
        )
        assert m["started_at"] and m["finished_at"] and m["error"] is None

        table = runner.invoke(cli.main, ["jobs", HOURLY])
        assert table.exit_code == 0 and "Coalesced" in table.stdout

        res = runner.invoke(cli.main, ["status", HOURLY, "--format", "json"])
        assert res.exit_code == 0, res.output
        [st] = json.loads(res.stdout)
        assert st["status"] == "Activated" and st["recompute_in_progress"] is False
        assert st["watermark"] == "2025-06-10T06:00:00Z" and st["frozen_until"] is None
        assert st["dirty_windows_pending"] == 0 and st["pending_recompute_ranges"] is None
        assert st["last_recompute_success_at"] and st["last_recompute_failure_reason"] is None

        res = runner.invoke(
            cli.main,
            [
                *("query", HOURLY, "--from", "2025-06-09T10:00", "--to", "2025-06-09T12:00Z"),
                *("--entity", "m1", "--format", "json"),
            ],
        )
        assert res.exit_code == 0, res.output
        got = json.loads(res.stdout)
        assert [r["bucket_start"] for r in got] == ["2025-06-09T10:00:00Z", "2025-06-09T11:00:00Z"]


def materialized_in(world: World, run_id: str) -> set[str]:
    events = world.instance.all_logs(run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION)
    return {e.asset_materialization.asset_key.to_user_string() for e in events}


def test_cli_materialize_leaves_the_levels_above_to_the_sensors_unless_downstream(
    world: World,
) -> None:
    build(world, (HOURLY, DAILY))
    late_write(world)
    args = ["materialize", HOURLY, "--from", "2025-06-09T10:00Z", "--to", "2025-06-09T11:00Z"]
    with cli_env(world) as runner, pytest.MonkeyPatch.context() as mp:
        mp.setattr("rollup_assets.definitions.defs", world.defs)
        mp.setattr(
            "rollup_assets.orchestration.instance.get_instance", lambda settings: world.instance
        )

        res = runner.invoke(cli.main, [*args, "--format", "json"])
        assert res.exit_code == 0, res.output
        [run] = json.loads(res.stdout)
        assert (run["rollup"], run["ok"]) == (HOURLY, True)
        assert materialized_in(world, run["run_id"]) == {HOURLY}
        assert problems(world, (HOURLY,)) == []
        # The day above is stale and says so: a chain job waits for the sensors.
        assert problems(world, (DAILY,)) != []
        pending = world.engine.ledger.snapshot().pending(DAILY)
        assert [(j.trigger, j.windows) for j in pending] == [(Trigger.CHAIN, (DAY_09,))]

        late_write(world, scale=5.0)  # corrected once more: this time the run carries it up
        # On a terminal, each level the run writes leaves its line: partitions done of total.
        terminal = Terminal()
        mp.setattr(progress, "sys", SimpleNamespace(stderr=terminal))
        res = runner.invoke(cli.main, [*args, "--downstream", "--format", "json"])
        assert res.exit_code == 0, res.output
        first = json.loads(res.stdout)[0]
        assert first["ok"] and first["rollup"] == HOURLY
        shown = [line.split("\r")[-1].rstrip() for line in terminal.getvalue().split("\n")]
        assert [line.rsplit(" (", 1)[0] for line in shown[:2]] == [
            f"materialize: {HOURLY} 1 of 1 partitions",
            f"materialize: {DAILY} 1 of 1 partitions",
        ], terminal.getvalue()
        assert all(line.endswith(" partitions/s)") for line in shown[:2]), shown
        # The day was rewritten inside the materialize run itself.
        assert materialized_in(world, first["run_id"]) == {HOURLY, DAILY}
        assert problems(world, (HOURLY, DAILY)) == []
        assert world.engine.ledger.snapshot().pending(DAILY) == []
        assert world.engine.ledger.job(pending[0].job_id).state in (  # type: ignore[union-attr]
            JobState.COMPLETED,
            JobState.COALESCED,
        )


# -- lifecycle guards ---------------------------------------------------------------------------


def changed_catalog(edit: Callable[[dict], object]) -> Catalog:
    doc = yaml.safe_load(DEFAULT_SPECS.read_text(encoding="utf-8"))
    edit(doc)
    return parse_catalog(doc, origin="edited")


def test_lifecycle_guards(world: World) -> None:
    assert {world.engine.states.get(n).status for n in world.catalog.names()} == {
        ArchiveStatus.CREATED
    }
    for name in ("energy_raw", HOURLY):
        with pytest.raises(ArchiveNotActivatedError, match="status Created"):
            world.query(name)
    with pytest.raises(RollupSourceMissingError):
        world.ops.activate(HOURLY, now=NOW)

    world.ops.activate("energy_raw", now=NOW)
    world.ops.activate(HOURLY, now=NOW)
    with pytest.raises(RollupSourceInUseError, match=HOURLY):
        world.ops.delete("energy_raw")
    assert world.engine.states.get("energy_raw").status is ArchiveStatus.ACTIVATED

    # Schema-relevant spec changes to activated archives are rejected everywhere.
    def add_column(doc: dict) -> None:
        doc["raw_archives"]["energy_raw"]["columns"]["current_a"] = {"type": "double"}

    def other_zone(doc: dict) -> None:
        for rollup in doc["rollups"].values():  # one zone per chain
            rollup["reference_time_zone"] = "UTC"

    for edit, name in ((add_column, "energy_raw"), (other_zone, HOURLY)):
        engine = Engine(changed_catalog(edit), world.engine.warehouse)
        ops = Operations(engine, actor="test")
        with pytest.raises(ArchiveSchemaImmutableError, match=name):
            ops.activate(name, now=NOW)
        with pytest.raises(ArchiveSchemaImmutableError):
            query_arrow(engine, name)
    engine = Engine(changed_catalog(other_zone), world.engine.warehouse)
    with pytest.raises(ArchiveSchemaImmutableError):
        Operations(engine).request_recompute(HOURLY, LATE_HOUR.start, LATE_HOUR.end)
    # A compatible change (a non-schema option) is accepted.
    relaxed = changed_catalog(lambda d: d["rollups"][HOURLY].update(watermark_lag="10m"))
    Operations(Engine(relaxed, world.engine.warehouse)).activate(HOURLY, now=NOW)

    # Deleting the rollup purges its queued work; then its raw source may go.
    queued = world.ops.request_recompute(HOURLY, LATE_HOUR.start, LATE_HOUR.end)
    assert world.ops.delete(HOURLY).status is ArchiveStatus.DELETED
    purged = world.engine.ledger.job(queued.job_id)
    assert purged is not None and purged.state is JobState.FAILED
    assert purged.error == "purged: archive was deleted"
    assert world.ops.delete("energy_raw").status is ArchiveStatus.DELETED
    with pytest.raises(ArchiveNotActivatedError, match="status Deleted"):
        world.query("energy_raw")


# -- the whole chain: scoped manual recompute, the open-bucket cap, rewind ----------------------

CHAIN_START = datetime(2025, 6, 6, 22, tzinfo=UTC)  # Saturday 2025-06-07 00:00 in Vienna
SCOPED = Window(datetime(2025, 6, 8, 10, tzinfo=UTC), datetime(2025, 6, 8, 12, tzinfo=UTC))
DAY_08 = Window(datetime(2025, 6, 7, 22, tzinfo=UTC), DAY_09.start)
WEEK_23 = Window(datetime(2025, 6, 1, 22, tzinfo=UTC), DAY_09.start)  # ISO week 2025-W23


@dataclass
class ChainWorld:
    world: World
    manual: Job  # the entity-scoped manual recompute, after it ran
    m2_before: list[tuple]
    m2_after: list[tuple]
    open_noop: Job  # a manual recompute of only the open daily bucket, after the tick


def _rows_of(world: World, name: str, entity: str, window: Window) -> list[tuple]:
    return [
        r
        for r in stored_rows(world, name, window.end)
        if dict(r)["entity_id"] == entity and dict(r)["bucket_start"] >= window.start
    ]


def corrupt(world: World, name: str, window: Window, entity: str) -> None:
    """A stored value gone wrong (what a manual recompute is for): the entity's rows of the
    rollup in `window` replaced by a generation whose energy sums are off by 1000."""
    from pyspark.sql import SparkSession

    store, spec = world.engine.rollups, world.catalog.rollup(name)
    rows = store.read_arrow(spec, [window], frozenset({entity}))
    i = rows.schema.get_field_index("energy_kwh_sum")
    bad = rows.set_column(i, "energy_kwh_sum", pc.add(rows["energy_kwh_sum"], 1000.0))
    keep = ["entity_id", "bucket_start", "bucket_end", *[c.name for c in spec.stored_columns]]
    spark = SparkSession.getActiveSession()
    assert spark is not None
    generation = store.next_generation(spec)
    written = store.write_rows(
        spark.createDataFrame(bad.select(keep)),
        spec,
        generation=generation,
        job_id="corrupt",
        run_id="corrupt",
        source_versions={},
    )
    store.commit_generation(spec, written, {"rollups.operation": "test"}, store.identity(spec))
    cells = Cells.of(buckets_in(spec, [window]), frozenset({entity}))
    store.flip(spec, cells, generation, job_id="corrupt", run_id="corrupt", fence=store.fence(spec))


@contextlib.contextmanager
def _module_world(root: Path) -> Iterator[World]:
    """Like the `world` fixture, for a world shared by a module."""
    wh, home = root / "warehouse", root / "dagster_home"
    home.mkdir(parents=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ROLLUPS_WAREHOUSE", str(wh))
        mp.setenv("DAGSTER_HOME", str(home))
        catalog = load_catalog()
        defs = build_definitions(
            catalog, WarehouseResource(root=str(wh)), settings=Settings.from_env()
        )
        with instance_in(home, catalog) as instance:
            yield World(root, catalog, Engine(catalog, Warehouse(str(wh))), defs, instance)


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, spark) -> Iterator[ChainWorld]:
    with _module_world(tmp_path_factory.mktemp("chain")) as world:
        build(world, tuple(world.catalog.rollups), start=CHAIN_START)
        assert compare_all(world.query, world.raw(), world.catalog) == []
        m2_before = _rows_of(world, HOURLY, "m2", SCOPED)
        corrupt(world, HOURLY, SCOPED, "m1")
        assert compare_all(world.query, world.raw(), world.catalog, names=[HOURLY]) != []
        job = world.ops.request_recompute(HOURLY, SCOPED.start, SCOPED.end, frozenset({"m1"}))
        noop = world.ops.request_recompute(DAILY, DAY_10.start, DAY_10.end)
        # The recompute changes no values, so open buckets need no refresh: recompute lane only.
        world.tick(NOW, sensors=("retroactive_write_sensor",))
        manual, open_noop = (
            world.engine.ledger.job(job.job_id),
            world.engine.ledger.job(noop.job_id),
        )
        assert manual is not None and open_noop is not None
        yield ChainWorld(world, manual, m2_before, _rows_of(world, HOURLY, "m2", SCOPED), open_noop)


def test_a_scoped_manual_recompute_repairs_only_its_entities_and_propagates_what_changed(
    chain: ChainWorld,
) -> None:
    world, job = chain.world, chain.manual
    assert (job.trigger, job.state, job.entities) == (
        Trigger.MANUAL,
        JobState.COMPLETED,
        frozenset({"m1"}),
    )
    assert job.windows_processed == 2 and job.rows_processed == 2
    # Only m1's buckets got a new generation; m2's rows are the very same rows as before.
    assert chain.m2_after == chain.m2_before
    hourly_ptrs = [p for p in pointers(world, HOURLY) if p["job_id"] == job.job_id]
    assert sorted((p["bucket_start"], p["entity_id"]) for p in hourly_ptrs) == [
        (SCOPED.start, "m1"),
        (SCOPED.start + H, "m1"),
    ]
    # Chain propagation to daily 06-08 for m1 only; the day's partial was right all along (only
    # the hourly rows had gone wrong), so nothing changes there and the chain stops.
    since = job.created_at
    [daily] = [j for j in jobs(world, DAILY) if j.trigger is Trigger.CHAIN and j.created_at > since]
    assert (daily.windows, daily.entities, daily.state) == (
        (DAY_08,),
        frozenset({"m1"}),
        JobState.COMPLETED,
    )
    assert (daily.cells_changed, daily.cells_skipped, daily.windows_processed) == (0, 1, 0)
    assert not [p for p in pointers(world, DAILY) if p["job_id"] == daily.job_id]
    assert not [j for j in jobs(world, WEEKLY) if j.created_at > since]
    for name in ("energy_monthly", "energy_yearly"):  # their buckets are still open: no chain
        assert not [j for j in jobs(world, name) if j.trigger is Trigger.CHAIN]
    assert compare_all(world.query, world.raw(), world.catalog) == []


def test_a_recompute_of_only_the_open_bucket_is_a_completed_no_op(chain: ChainWorld) -> None:
    job = chain.open_noop
    assert job.state is JobState.COMPLETED and job.windows_processed == 0
    ptrs = pointers(chain.world, DAILY)
    assert ptrs and all(p["bucket_start"] < DAY_10.start for p in ptrs)


def test_rewind_then_forward_ticks_match_the_oracle_at_every_level(chain: ChainWorld) -> None:
    world = chain.world
    boundary = SCOPED.start
    assert any(p["bucket_start"] >= boundary for p in pointers(world, HOURLY))
    with pytest.raises(InvalidTimeRangeError, match="bucket boundary"):
        world.ops.rewind(HOURLY, boundary + Q)
    state, dropped = world.ops.rewind(HOURLY, boundary)
    assert state.watermark == boundary and dropped > 0  # the recomputed rows past it
    assert all(p["bucket_start"] < boundary for p in pointers(world, HOURLY))
    assert world.engine.states.history(HOURLY)[-1].reason.startswith("rewind to")

    # A write after the new watermark is forward work (not a retroactive one): only the forward
    # re-aggregation can pick it up, and only if the dropped pointers no longer mask it.
    late_write(world, Window(SCOPED.start, SCOPED.start + 2 * Q), scale=7.0)
    world.tick(NOW)
    assert world.engine.states.get(HOURLY).watermark == datetime(2025, 6, 10, 6, tzinfo=UTC)
    assert compare_all(world.query, world.raw(), world.catalog) == []
