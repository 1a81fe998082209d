"""The surface a plain Delta reader is pointed at (`rollups/<rollup>__active`) holds exactly the
active rows at every level: after corrections whose superseded rows stay in the row tables, after
a run died between its flip and its publish, after a restore, and when it was never built.

Every read here is delta-rs (or DuckDB over delta-rs's dataset) on the table path docs/reads.md
names, never this project's read path; the values are compared with the pandas oracle."""

import json
import shutil
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import dagster as dg
import duckdb
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

import rollup_assets.services.surface_reads as surface_reads
from rollup_assets.assembly import build_definitions
from rollup_assets.compute.arrow_types import TS
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import CURSOR_KEY, tick
from rollup_assets.resources.change_feed import ChangeFeed
from rollup_assets.resources.delta_tables import file_actions, open_table, read_commit
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.backup import backup, restore
from rollup_assets.services.engine import Engine
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.surface import GENMAP_APP, publish, reflected
from rollup_assets.services.surface_lag import surface_lag
from rollup_assets.services.surface_layout import (
    SURFACE_SPARES,
    averaged_partials,
    fold_state,
    query_columns,
)
from rollup_assets.settings import Settings
from tests.conftest import World, days, fault_at
from tests.integration.test_crash_points import open_world, template_root, world_copy
from tests.oracle import compare, compare_all, oracle

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
# A year end (ISO week 1 of 2025 starts on Monday 2024-12-30) and the spring DST change in
# Vienna (2025-03-30, a 23-hour local day), with the month ends next to them.
RANGES = [(date(2024, 12, 29), 4), (date(2025, 3, 29), 3)]
METERS = 3
METER = "meter-0001"
# Local (Vienna) 2025-01-01 00:15 (in the open yearly bucket: the forward lane rewrites it in
# place), 2024-12-30 11:00 and 2025-03-30 03:30 (just after the clocks jump).
CORRECTED = [
    datetime(2024, 12, 31, 23, 15, tzinfo=UTC),
    datetime(2024, 12, 30, 10, 0, tzinfo=UTC),
    datetime(2025, 3, 30, 1, 30, tzinfo=UTC),
]
# The recompute lane and the publish of what it flips (the forward lane is tested on its own).
RETROACTIVE = ("retroactive_write_sensor", "surface_publish_sensor")
DETECTION = ("retroactive_write_sensor",)
PUBLISH = ("surface_publish_sensor",)
# The year 2025 (local) is the yearly rollup's open bucket, the forward lane's (tested on its own
# below); the chain's cases run the retroactive sensor only and compare the buckets before it.
OPEN = {"energy_yearly": datetime(2024, 12, 31, 23, 0, tzinfo=UTC)}


def matches_oracle(world: World, raw: pd.DataFrame | None = None) -> list[str]:
    """Differences between every level's surface and the oracle (of `raw`, default: now)."""
    raw = world.raw() if raw is None else raw
    return compare_all(lambda n: surface(world, n), raw, world.catalog, only_before=OPEN)


def surface(world: World, rollup: str) -> pa.Table:
    """The rollup's surface as a plain Delta reader sees its latest snapshot, in the columns a
    query returns; each average it holds is checked against the sum and count it also holds."""
    t = DeltaTable(str(world.root / "warehouse" / "rollups" / f"{rollup}__active"))
    rows = pa.table(t.to_pyarrow_table())
    assert "bucket_part" in rows.column_names
    spec = world.catalog.rollup(rollup)
    for agg in spec.aggregations:
        if agg.function is AggregateFunction.AVG:
            out = agg.output_name
            total, count = rows[f"{out}__sum"], rows[f"{out}__count"]
            merged = pc.if_else(
                pc.greater(count, 0), pc.divide(total, pc.cast(count, "double")), None
            )
            assert merged.equals(rows[out]), out
    return rows.select(query_columns(spec)).sort_by(
        [("bucket_start", "ascending"), ("entity_id", "ascending")]
    )


def row_table(world: World, rollup: str) -> pa.Table:
    """The rollup's main row table, read plainly (every generation it still holds)."""
    t = DeltaTable(str(world.root / "warehouse" / "rollups" / rollup))
    return pa.table(t.to_pyarrow_table())


def duplicated_cells(rows: pa.Table) -> int:
    counts = rows.group_by(["entity_id", "bucket_start"]).aggregate([("entity_id", "count")])
    return counts.filter(pc.greater(counts["entity_id_count"], 1)).num_rows


def build_chain(root: Path) -> None:
    world = open_world(root)
    try:
        world.ops.activate("energy_raw", now=NOW)
        batches = [day_batch(d, METERS, seed=4) for first, n in RANGES for d in days(first, n)]
        world.ingest(pa.concat_tables(batches), source="Import")
        world.activate_all(NOW)
        spans = []
        for first, n in RANGES:
            start = datetime(first.year, first.month, first.day, tzinfo=UTC)
            spans.append(Window(start, start + timedelta(days=n)))
        world.backfill(spans)
        assert compare_all(world.query, world.raw(), world.catalog, only_before=OPEN) == []
    finally:
        world.instance.dispose()


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory, spark) -> Path:
    return template_root(tmp_path_factory, "surface-template", build_chain)


@pytest.fixture
def chain(template: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[World]:
    """A copy of the backfilled chain."""
    yield from world_copy(template, tmp_path, monkeypatch)


def correction(instants: list[datetime], value: float) -> pa.Table:
    return pa.Table.from_pylist(
        [{"entity_id": METER, "ts": t, "energy_kwh": value + i} for i, t in enumerate(instants)]
    )


def keep_superseded_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    """Superseded generations stay in the row tables (as a deferred or retained sweep leaves
    them): sweeps delete nothing."""
    monkeypatch.setattr(RollupStore, "sweep", lambda self, *a, **kw: 0)


def test_surface_holds_exactly_the_active_rows_while_superseded_rows_stay(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    keep_superseded_rows(monkeypatch)
    world.ingest(correction(CORRECTED, 50.0))
    world.tick(NOW, sensors=RETROACTIVE)
    world.ingest(correction(CORRECTED[:2], 70.0))  # the same cells corrected twice
    world.tick(NOW, sensors=RETROACTIVE)

    for name in world.catalog.rollups:
        # A reader of the main row table would count the corrected cells more than once...
        assert duplicated_cells(row_table(world, name)) > 0, name
        # ...the surface holds one row per cell.
        assert duplicated_cells(surface(world, name)) == 0, name
    assert matches_oracle(world) == []
    # And it is what the project's own read path returns.
    for name in world.catalog.rollups:
        assert surface(world, name).equals(world.query(name)), name

    # SQL over the same snapshot: DuckDB scans delta-rs's dataset of the surface (its own
    # `delta_scan` needs the delta extension, which DuckDB downloads on first use).
    path = world.root / "warehouse" / "rollups" / "energy_daily__active"
    active = DeltaTable(str(path)).to_pyarrow_dataset()  # noqa: F841 - scanned by DuckDB
    total = duckdb.sql("select sum(energy_kwh_sum) from active").fetchall()
    expected = pc.sum(world.query("energy_daily")["energy_kwh_sum"]).as_py()
    assert total[0][0] == pytest.approx(expected)


def test_a_one_cell_correction_rewrites_one_partition_of_the_surface(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    keep_superseded_rows(monkeypatch)
    spec = world.catalog.rollup("energy_hourly")
    uri = world.engine.rollups.surface_uri(spec)
    before = DeltaTable(uri)
    files_before = len(before.file_uris())
    marker = before.version()
    world.ingest(correction(CORRECTED[2:], 9.0))
    world.tick(NOW, sensors=RETROACTIVE)
    after = DeltaTable(uri)
    removed = added = 0
    for v in range(marker + 1, after.version() + 1):
        actions = read_commit(uri, v)
        removed += sum(1 for a in actions if "remove" in a)
        added += sum(1 for a in actions if "add" in a)
    assert files_before >= 7  # one file per UTC day of data
    assert (removed, added) == (1, 1)  # only the corrected hour's UTC day was rewritten
    assert matches_oracle(world) == []


def test_a_flip_not_yet_published_leaves_a_consistent_surface_that_converges(
    chain: World, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    world = chain
    keep_superseded_rows(monkeypatch)
    old_raw = world.raw()
    world.ingest(correction(CORRECTED, 30.0))
    hourly = world.catalog.rollup("energy_hourly")
    key = "2025-03-30-03:00"  # Vienna local hour holding the DST-day correction
    run = world.materialize("energy_hourly", key, key)  # flips; the run does not publish
    assert run.success, run.error

    # Flipped but not published: the surface still shows the previous state, whole.
    snap = world.engine.rollups.snapshot(hourly)
    lagging = DeltaTable(world.engine.rollups.surface_uri(hourly))
    assert lagging.transaction_version(GENMAP_APP) < snap.genmap_version
    assert matches_oracle(world, old_raw) == []
    # The query path does not read a lagging surface: it resolves the flipped state.
    hour = datetime(2025, 3, 30, 1, 0, tzinfo=UTC)  # the corrected local 03:00
    new, old = (oracle(raw, hourly) for raw in (world.raw(), old_raw))
    got = world.query("energy_hourly", start=hour, end=hour + timedelta(hours=1))
    assert compare(got, new[new["bucket_start"] == hour], hourly) == []
    assert compare(got, old[old["bucket_start"] == hour], hourly) != []  # the correction shows

    # A backup taken now holds the lagging surface; the restore publishes it.
    backup(world.engine, str(tmp_path / "backup"))
    restored = Engine(world.catalog, Warehouse(str(tmp_path / "restored")))
    restore(restored, str(tmp_path / "backup"))
    t = DeltaTable(str(tmp_path / "restored" / "rollups" / "energy_hourly__active"))
    assert t.transaction_version(GENMAP_APP) == snap.genmap_version

    # The publish sensor publishes what the runs flipped: every level converges.
    world.tick(NOW, sensors=RETROACTIVE)
    assert matches_oracle(world) == []
    hourly_spec = world.catalog.rollup("energy_hourly")
    hidden = ["bucket_part", *averaged_partials(hourly_spec), *fold_state(hourly_spec)]
    restored_rows = pa.table(t.to_pyarrow_table()).drop_columns(hidden)
    fresh = world.query("energy_hourly")
    march = pc.greater_equal(fresh["bucket_start"], pa.scalar(datetime(2025, 3, 1), TS))
    at_crash = restored_rows.sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
    # The restored hourly surface is the flipped state: the DST-day correction is in it.
    assert at_crash.filter(
        pc.greater_equal(at_crash["bucket_start"], pa.scalar(datetime(2025, 3, 1), TS))
    ).equals(fresh.filter(march))


def test_a_query_reads_a_current_surface_as_resolving_the_pointers_would(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    keep_superseded_rows(monkeypatch)
    world.ingest(correction(CORRECTED, 30.0))
    world.tick(NOW, sensors=RETROACTIVE)
    now = datetime.now(UTC)
    # An as-of read always resolves the pointers (from the tables' versions at that time).
    resolved = {n: world.query(n, as_of=now) for n in world.catalog.rollups}
    spans = [(None, None), (datetime(2024, 12, 30, tzinfo=UTC), datetime(2025, 3, 30, tzinfo=UTC))]

    def unused(*args: object, **kwargs: object) -> pa.Table:
        raise AssertionError("the row table was read: the surface is current")

    # Maintenance's compaction, vacuum and checkpoints commit after its publish: the surface
    # still holds the active rows, and is still read.
    maintain(world.engine, now=NOW, enforce_retention=False)
    hourly = world.catalog.rollup("energy_hourly")
    behind = reflected(DeltaTable(world.engine.rollups.surface_uri(hourly)))
    assert behind != world.engine.rollups.snapshot(hourly).reflects
    read_row_table = RollupStore.read_arrow
    monkeypatch.setattr(RollupStore, "read_arrow", unused)
    for name, want in resolved.items():
        assert world.query(name).equals(want), name
        for start, end in spans[1:]:
            got = world.query(name, start=start, end=end)
            inside = pc.and_(
                pc.greater_equal(want["bucket_start"], pa.scalar(start, TS)),
                pc.less(want["bucket_start"], pa.scalar(end, TS)),
            )
            assert got.equals(want.filter(inside)), name
    # A read of named entities resolves the pointers (the row table is sorted by entity).
    monkeypatch.setattr(RollupStore, "read_arrow", read_row_table)
    for name, want in resolved.items():
        got = world.query(name, entities=[METER])
        assert got.equals(want.filter(pc.equal(want["entity_id"], METER))), name


def test_a_lagging_read_folds_the_differences_since_the_publish_onto_the_surface(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the surface lags behind corrections, a query folds the differences flipped since
    the publish onto the surface rows' fold state (cells corrected before the publish and again
    after it, and cells corrected for the first time), and reads the rest from the row table (a
    bucket rewritten in place, an extreme that left): the same bits as resolving every pointer,
    and as the surface once published."""
    world = chain
    world.ingest(correction(CORRECTED[1:], 40.0))
    world.tick(NOW, sensors=RETROACTIVE)  # corrected and published
    assert matches_oracle(world) == []
    # Energy re-read at the corrected instants and at one more, every other value as stored: no
    # kept extreme leaves a cell.
    instants = [*CORRECTED, datetime(2025, 3, 29, 12, 0, tzinfo=UTC)]
    stored = world.engine.raw.read_arrow(world.catalog.archive("energy_raw"))
    picked = pc.and_(
        pc.equal(stored["entity_id"], METER), pc.is_in(stored["ts"], pa.array(instants, TS))
    )
    again = stored.filter(picked).select(["entity_id", "ts", "energy_kwh", "power_kw", "voltage_v"])
    energy = pc.add(again["energy_kwh"], pa.scalar(0.1))
    world.ingest(again.set_column(2, "energy_kwh", energy))
    world.tick(NOW, sensors=DETECTION)  # flipped, not published
    taken: dict[str, tuple[int, int]] = {}
    real = surface_reads.folded_on_surface

    def spied(*args: Any) -> tuple[pa.Table, Any]:
        folded, rest = real(*args)
        taken[args[1].name] = (folded.num_rows, rest.pointers.num_rows)
        return folded, rest

    monkeypatch.setattr(surface_reads, "folded_on_surface", spied)
    lagging = {n: world.query(n) for n in world.catalog.rollups}
    # Every closed cell corrected is folded on the surface (the open year is the forward
    # lane's, rewritten in place).
    closed = {n: taken[n] for n in taken if n != "energy_yearly"}
    assert len(closed) == 4 and all(f > 0 and r == 0 for f, r in closed.values()), taken
    now = datetime.now(UTC)
    for name, rows in lagging.items():
        assert rows.equals(world.query(name, as_of=now)), name
    # A correction that takes a cell's shown extreme out of it: that cell is read from the row
    # table, the others still folded on the surface.
    world.tick(NOW, sensors=PUBLISH)
    hour = datetime(2025, 3, 29, 12, 0, tzinfo=UTC)
    in_hour = stored.filter(
        pc.and_(
            pc.equal(stored["entity_id"], METER),
            pc.and_(
                pc.greater_equal(stored["ts"], pa.scalar(hour, TS)),
                pc.less(stored["ts"], pa.scalar(hour + timedelta(hours=1), TS)),
            ),
        )
    ).select(["entity_id", "ts", "energy_kwh", "power_kw", "voltage_v"])
    # Its lowest voltages raised above the rest: more of the smallest values leave than the
    # surface row keeps.
    lowest = in_hour.take(pc.sort_indices(in_hour["voltage_v"])[:SURFACE_SPARES])
    top = pc.max(in_hour["voltage_v"]).as_py()
    voltage = pa.array([top + 1.0 + i for i in range(SURFACE_SPARES)])
    world.ingest(lowest.set_column(4, "voltage_v", voltage))
    world.tick(NOW, sensors=DETECTION)
    taken.clear()
    lagging = {n: world.query(n) for n in world.catalog.rollups}
    assert any(r > 0 for _, r in taken.values()) and any(f > 0 for f, _ in taken.values()), taken
    now = datetime.now(UTC)
    for name, rows in lagging.items():
        assert rows.equals(world.query(name, as_of=now)), name
    world.tick(NOW, sensors=PUBLISH)
    assert matches_oracle(world) == []
    for name, rows in lagging.items():
        assert world.query(name).equals(rows), name


def test_reads_share_one_opened_version_of_a_row_table_until_the_rollup_moves(
    chain: World,
) -> None:
    """A lagging read's snapshot (`read_snapshot`) opens the row table's version once for every
    read of it, and lists its files once; it is the snapshot a writer would take, and a
    correction moves it."""
    world, spec = chain, chain.catalog.rollup("energy_daily")
    rollups = world.engine.rollups
    first, again = rollups.read_snapshot(spec), rollups.read_snapshot(spec)
    assert first.table is again.table and first.table is not None
    assert first.reflects == rollups.snapshot(spec).reflects
    assert first.pointers.equals(rollups.snapshot(spec).pointers)
    listed = sorted(f["path"] for f in file_actions(rollups.snapshot(spec).table))
    first.files().clear()  # a caller's list, not the one kept
    assert sorted(f["path"] for f in again.files()) == listed
    world.ingest(correction(CORRECTED[1:], 40.0))
    world.tick(NOW, sensors=RETROACTIVE)
    moved, taken = rollups.read_snapshot(spec), rollups.snapshot(spec)
    assert moved.reflects == taken.reflects and moved.reflects != first.reflects
    assert moved.pointers.equals(taken.pointers) and moved.table is not first.table
    assert sorted(f["path"] for f in moved.files()) == sorted(
        f["path"] for f in file_actions(taken.table)
    )


def test_a_missing_surface_is_built_by_maintenance_and_a_dropped_rollup_loses_it(
    chain: World,
) -> None:
    world = chain
    root = world.root / "warehouse" / "rollups"
    for name in world.catalog.rollups:
        shutil.rmtree(root / f"{name}__active")  # an archive from before surfaces existed
    report = maintain(world.engine, now=NOW)
    assert report.surfaces_published == len(world.catalog.rollups)
    assert matches_oracle(world) == []
    again = publish(world.engine, world.catalog.rollup("energy_daily"))
    assert not again.changed

    world.ops.delete("energy_yearly")
    assert not (root / "energy_yearly__active").exists()
    assert (root / "energy_monthly__active").exists()


def test_forward_writes_are_published_by_the_publish_sensor_and_a_dead_publish_is_repaired(
    world: World,
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.activate_all(NOW)
    batch = day_batch(NOW.date(), METERS, seed=2)
    ts = batch["ts"]
    fresh = pc.and_(
        pc.greater_equal(ts, pa.scalar(NOW, TS)),
        pc.less(ts, pa.scalar(NOW + timedelta(hours=2), TS)),
    )
    world.ingest(batch.filter(fresh))
    later = NOW + timedelta(hours=3)
    world.tick(later, sensors=("forward_aggregation_sensor",))

    # The forward rows are committed; the run published nothing: every surface lags.
    hourly = world.catalog.rollup("energy_hourly")
    assert world.query("energy_hourly").num_rows > 0
    lag = surface_lag(world.engine, hourly)
    assert lag.needs_publish and lag.since is not None
    assert 0 <= (lag.seconds(datetime.now(UTC)) or -1) < 600

    # A publish of the hourly surface that fails after writing its files commits nothing: no
    # hourly surface yet (the run still publishes the other levels, and fails).
    with fault_at("publish_written", archive="energy_hourly"):
        report = tick(world.defs, world.instance, later, sensors=PUBLISH)
    assert [r.success for r in report.runs] == [False]
    assert open_table(world.engine.rollups.surface_uri(hourly)) is None
    assert surface_lag(world.engine, hourly).needs_publish
    daily = world.catalog.rollup("energy_daily")
    assert not surface_lag(world.engine, daily).needs_publish

    # The next tick asks for the publish again (its next attempt), and every level converges.
    again = tick(world.defs, world.instance, later, sensors=PUBLISH)
    assert [r.success for r in again.runs] == [True]
    assert again.runs[0].tags["dagster/run_key"] != report.runs[0].tags["dagster/run_key"]
    for name in world.catalog.rollups:
        assert surface(world, name).equals(world.query(name)), name
        assert not surface_lag(world.engine, world.catalog.rollup(name)).needs_publish, name
    assert not publish(world.engine, hourly).changed
    assert tick(world.defs, world.instance, later, sensors=PUBLISH).runs == []  # quiet


def publish_cursor(world: World) -> dict:
    key = CURSOR_KEY.format("surface_publish_sensor")
    return json.loads(world.instance.run_storage.get_cursor_values({key})[key])


def age_launches(world: World, seconds: float) -> None:
    """The publish sensor's memory of its launches, as if they were `seconds` older."""
    cursor = publish_cursor(world)
    cursor["launched"] = {n: t - seconds for n, t in cursor["launched"].items()}
    key = CURSOR_KEY.format("surface_publish_sensor")
    world.instance.run_storage.set_cursor_values({key: json.dumps(cursor)})


def test_runs_flip_without_publishing_and_one_publish_run_brings_every_level_up(
    chain: World,
) -> None:
    world = chain
    world.ingest(correction(CORRECTED[1:], 40.0))
    world.tick(NOW, sensors=DETECTION)
    # Every level changed (the open year by a refresh of its bucket in the same run)...
    lagging = {n for n, s in world.catalog.rollups.items() if surface_lag(world.engine, s).since}
    assert lagging == set(world.catalog.rollups)
    # ...and a plain reader still sees the state before the correction, whole.
    assert matches_oracle(world) != []

    first = tick(world.defs, world.instance, NOW, sensors=PUBLISH)
    (run,) = first.runs  # one run for every lagging level
    assert run.success and run.job_name == "publish_surfaces"
    assert set(run.tags["rollups/surfaces"].split(",")) == lagging
    assert run.tags["dagster/run_key"].startswith("surface:")
    assert matches_oracle(world) == []
    cursor = publish_cursor(world)
    assert set(cursor["launched"]) == lagging
    assert {n for n, mark in cursor["lagging"].items() if mark != "none"} == lagging
    # The run recorded the lag it closed on each asset.
    observed = world.instance.fetch_observations(dg.AssetKey("energy_daily"), limit=5).records
    metadata = [r.asset_observation.metadata for r in observed if r.asset_observation]
    assert any("surface_lag_closed_seconds" in m for m in metadata)
    # A second tick finds nothing lagging: no request, the same launches remembered, and the
    # end of the lag observed.
    second = tick(world.defs, world.instance, NOW, sensors=PUBLISH)
    assert second.runs == []
    after = publish_cursor(world)
    assert after["launched"] == cursor["launched"]
    assert set(after["lagging"].values()) == {"none"}
    latest = world.instance.fetch_observations(dg.AssetKey("energy_daily"), limit=1).records
    assert latest[0].asset_observation is not None
    assert latest[0].asset_observation.metadata["surface_lag_seconds"].value == 0.0


def spaced_definitions(world: World) -> dg.Definitions:
    """The world's definitions with a lag bound of 60 s: publishes of one rollup 30 s apart."""
    settings = replace(Settings.from_env(), surface_max_lag_seconds=60)
    return build_definitions(
        world.catalog, WarehouseResource(root=str(world.root / "warehouse")), settings=settings
    )


def test_a_publish_waits_for_a_correction_whose_commit_is_not_detected_yet(chain: World) -> None:
    """A publish launched while a source holds commits no detection has read would take the
    cores (and the ready run process) from the correction they start: it waits for it, and one
    publish then brings both corrections."""
    world = chain
    defs = spaced_definitions(world)
    world.ingest(correction(CORRECTED[1:2], 44.0))
    world.tick(NOW, sensors=DETECTION)
    age_launches(world, 31)  # the chain's own publish (building it) is 30 s old
    world.ingest(correction(CORRECTED[2:], 45.0))  # not detected yet
    assert tick(defs, world.instance, NOW, sensors=PUBLISH).runs == []
    world.tick(NOW, sensors=DETECTION)
    runs = tick(defs, world.instance, NOW, sensors=PUBLISH).runs
    assert [r.success for r in runs] == [True]
    assert matches_oracle(world) == []


def test_a_source_that_cannot_be_opened_holds_no_publish_back(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world = chain
    defs = spaced_definitions(world)
    world.ingest(correction(CORRECTED[1:2], 46.0))
    world.tick(NOW, sensors=DETECTION)
    age_launches(world, 31)

    def unreadable(self: ChangeFeed, spec: object) -> int:
        raise OSError("the source's log cannot be read")

    monkeypatch.setattr(ChangeFeed, "latest_version", unreadable)
    runs = tick(defs, world.instance, NOW, sensors=PUBLISH).runs
    assert [r.success for r in runs] == [True]
    assert matches_oracle(world) == []


def test_publishes_of_one_rollup_are_spaced_so_a_stream_of_flips_coalesces(
    chain: World,
) -> None:
    world = chain
    defs = spaced_definitions(world)
    world.ingest(correction(CORRECTED[1:2], 41.0))
    world.tick(NOW, sensors=DETECTION)
    age_launches(world, 31)  # the chain's own publish (building it) is 30 s old
    assert [r.success for r in tick(defs, world.instance, NOW, sensors=PUBLISH).runs] == [True]
    # A second correction right after: flipped, but its publish waits for the spacing (30 s).
    world.ingest(correction(CORRECTED[1:2], 42.0))
    world.tick(NOW, sensors=DETECTION)
    hourly = world.catalog.rollup("energy_hourly")
    assert surface_lag(world.engine, hourly).needs_publish
    assert tick(defs, world.instance, NOW, sensors=PUBLISH).runs == []
    # A third one joins it; once the spacing has passed, one publish takes both.
    world.ingest(correction(CORRECTED[2:], 43.0))
    world.tick(NOW, sensors=DETECTION)
    age_launches(world, 31)
    runs = tick(defs, world.instance, NOW, sensors=PUBLISH).runs
    assert [r.success for r in runs] == [True]
    assert matches_oracle(world) == []
