"""delta-spark, Delta's reference implementation, reads every table the project writes, and
agrees with the project's own reads: raw archives and their change data feed, rollup rows,
pointer tables, surfaces, the control tables, their history, time travel, and the checkpoints
maintenance writes.

One installation is built once for the module (a backfill, a correction, a delete and a
maintenance pass); each test reads it through the session-scoped Spark session, which loads
Delta's jars like every session the project starts. In this module delta-spark rebuilds a table's
state in two partitions, one per core of that local session (`small_snapshots`).
"""

import json
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.warehouse import spark_uri
from rollup_assets.services.ingest import delete_rows
from rollup_assets.services.maintenance import maintain, table_uris
from rollup_assets.services.query import query_arrow
from tests.conftest import World, days, world_of

NOW = datetime(2025, 3, 6, 12, tzinfo=UTC)
FIRST = date(2025, 2, 27)  # across a month end
DAYS = 4
METERS = 3
ALL_TIME = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))
SNAPSHOT_PARTITIONS = "spark.databricks.delta.snapshotPartitions"


@contextmanager
def small_snapshots(spark: SparkSession) -> Iterator[None]:
    """delta-spark rebuilding a table's state (its log replayed) in two partitions, one per core
    of the local session, while the context is open; the session's own setting after. The tables
    here are small and nearly every read is a table's first (a state rebuilt), which then costs
    about half what the setting of the project's sessions (8) does. What is read is the same: the
    partitions only split the log's replay. The project's own reads and writes in these tests go
    through delta-rs: delta-spark is only the reader and the writer under test."""
    before = spark.conf.get(SNAPSHOT_PARTITIONS, None)
    spark.conf.set(SNAPSHOT_PARTITIONS, "2")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(SNAPSHOT_PARTITIONS)
        else:
            spark.conf.set(SNAPSHOT_PARTITIONS, before)


@pytest.fixture(scope="module", autouse=True)
def _small_snapshots(spark: SparkSession) -> Iterator[None]:
    with small_snapshots(spark):
        yield


class Built:
    """The installation and what happened to it, in order."""

    def __init__(self, world: World) -> None:
        self.world = world
        self.before_correction: datetime | None = None  # a time between two settled states
        self.raw_versions: dict[str, int] = {}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[Built]:
    with pytest.MonkeyPatch.context() as mp:
        from rollup_assets.model.spec_loader import load_catalog

        for world in world_of(tmp_path_factory.mktemp("delta-spark-reads"), mp, load_catalog()):
            b = Built(world)
            spec = world.catalog.archive("energy_raw")
            world.ops.activate("energy_raw", now=NOW)
            world.ingest(
                pa.concat_tables([day_batch(d, METERS, seed=3) for d in days(FIRST, DAYS)])
            )
            world.activate_all(NOW)
            start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
            world.backfill([Window(start, start + timedelta(days=DAYS))])
            world.tick(NOW)
            b.raw_versions["settled"] = world.engine.raw.table(spec).version()  # type: ignore[union-attr]
            time.sleep(1.0)  # commit times on either side of this instant differ
            b.before_correction = datetime.now(UTC)
            time.sleep(1.0)
            corrected = day_batch(date(2025, 2, 28), METERS, seed=3)
            corrected = corrected.set_column(
                2, "energy_kwh", pc.multiply(corrected["energy_kwh"], 3.0)
            )
            world.ingest(corrected.slice(0, 40), source="Manual")
            b.raw_versions["corrected"] = world.engine.raw.table(spec).version()  # type: ignore[union-attr]
            gone = Window(datetime(2025, 3, 1, 6, tzinfo=UTC), datetime(2025, 3, 1, 9, tzinfo=UTC))
            delete_rows(
                world.engine,
                "energy_raw",
                gone,
                frozenset({"meter-0001"}),
                ChangeSource.MANUAL,
                retention=False,
            )
            world.tick(NOW)
            maintain(world.engine, now=NOW)
            yield b


def delta_read(spark: SparkSession, uri: str, **options: object) -> pa.Table:
    reader = spark.read.format("delta")
    for k, v in options.items():
        reader = reader.option(k, str(v))
    return reader.load(spark_uri(uri)).toArrow()


def rows(table: pa.Table, columns: list[str] | None = None) -> list[dict]:
    """Every row (of `columns`), in one order; strings of either Arrow layout alike."""
    table = table.select(columns or table.column_names)
    plain = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in table.schema]
    )
    out = table.cast(plain).to_pylist()
    return sorted(out, key=lambda r: json.dumps(r, default=str, sort_keys=True))


def tables(b: Built) -> list[str]:
    """Every table of the installation (a rollup only the forward lane wrote has no pointers)."""
    wh = b.world.engine.warehouse
    return [u for u in table_uris(wh, b.world.catalog) if open_table(u) is not None]


def raw_uri(b: Built) -> str:
    return b.world.engine.raw.uri(b.world.catalog.archive("energy_raw"))


def test_raw_archive_reads_the_same(built: Built, spark: SparkSession) -> None:
    engine = built.world.engine
    spec = built.world.catalog.archive("energy_raw")
    ours = engine.raw.read_arrow(spec)  # type: ignore[arg-type]
    theirs = delta_read(spark, raw_uri(built))
    assert theirs.schema == ours.schema
    assert ours.num_rows > 1000 and rows(theirs) == rows(ours)


def test_the_change_feed_reads_the_same(built: Built, spark: SparkSession) -> None:
    engine = built.world.engine
    spec = built.world.catalog.archive("energy_raw")
    latest = engine.raw.table(spec).version()  # type: ignore[union-attr]
    ours, _ = engine.raw.changes(spec, 0, latest, [ALL_TIME], None)  # type: ignore[arg-type]
    theirs = delta_read(spark, raw_uri(built), readChangeFeed="true", startingVersion=1)
    kinds = {k: sorted(set(pc.unique(t["_change_type"]).to_pylist())) for k, t in [("o", ours)]}
    # The first load (inserts), the correction (both images of each changed reading) and the
    # delete are all there.
    assert kinds["o"] == ["delete", "insert", "update_postimage", "update_preimage"]
    assert ours.num_rows > 1000
    assert rows(theirs, ours.column_names) == rows(ours)


def test_rollup_rows_pointers_and_surfaces_read_the_same(built: Built, spark: SparkSession) -> None:
    engine, catalog = built.world.engine, built.world.catalog
    wh = engine.warehouse
    pointed = 0
    for name in catalog.rollups:
        spec = catalog.rollup(name)
        stored = DeltaTable(wh.rollup_path(name)).to_pyarrow_table()
        assert rows(delta_read(spark, wh.rollup_path(name))) == rows(stored), name
        pointers, version = read_pointers(engine.rollups.genmap_uri(spec), wh.storage_options)
        if version is not None:  # a rollup only the forward lane wrote has no pointer table
            pointed += pointers.num_rows
            assert rows(delta_read(spark, wh.genmap_path(name))) == rows(pointers), name
        # The surface, read as a plain Delta table, is what the project's query returns.
        surface = delta_read(spark, wh.surface_path(name))
        queried = query_arrow(engine, name)
        assert queried.num_rows > 0
        assert rows(surface, queried.column_names) == rows(queried), name
    assert pointed > 0  # the recomputes' generations (forward writes need no pointer)


def test_control_tables_read_the_same(built: Built, spark: SparkSession) -> None:
    wh = built.world.engine.warehouse
    for table in ("archives", "ledger"):
        ours = DeltaTable(wh.control_path(table)).to_pyarrow_table()
        assert ours.num_rows > 0
        assert rows(delta_read(spark, wh.control_path(table))) == rows(ours), table
    states = rows(delta_read(spark, wh.control_path("archives")), ["archive", "status"])
    assert {r["archive"] for r in states} == set(built.world.catalog.names())


def test_history_shows_every_commit_and_its_operation(built: Built, spark: SparkSession) -> None:
    for uri in tables(built):
        ours = sorted(DeltaTable(uri).history(), key=lambda c: c["version"])
        theirs = (
            spark.sql(f"DESCRIBE HISTORY delta.`{spark_uri(uri)}`")
            .select("version", "operation", "operationParameters", "userMetadata")
            .orderBy("version")
            .toArrow()
            .to_pylist()
        )
        assert [(c["version"], c["operation"]) for c in ours] == [
            (c["version"], c["operation"]) for c in theirs
        ], uri
        assert [c.get("operationParameters") or {} for c in ours] == [
            dict(c["operationParameters"] or []) for c in theirs
        ], uri
        # The project's own commit metadata (`rollups.operation`, ...) is written as extra keys
        # of the commit info, which delta-rs returns and delta-spark's history does not show.
        assert all(c["userMetadata"] is None for c in theirs), uri
    raw = sorted(DeltaTable(raw_uri(built)).history(), key=lambda c: c["version"])
    assert [(c["operation"], c.get("rollups.operation")) for c in raw] == [
        ("WRITE", "provision"),
        ("MERGE", "ingest"),
        ("MERGE", "ingest"),
        ("DELETE", "delete"),
        # Maintenance's retention pass moved the retained-from instant with nothing to drop: an
        # empty commit records it, so an ingest racing the pass conflicts (`fence_retention`).
        ("WRITE", "retention"),
    ]


def test_time_travel_equals_as_of_reads(built: Built, spark: SparkSession) -> None:
    engine = built.world.engine
    spec = built.world.catalog.archive("energy_raw")
    for version in built.raw_versions.values():
        ours = engine.raw.read_arrow(spec, table=engine.raw.table(spec, version))  # type: ignore[arg-type]
        assert rows(delta_read(spark, raw_uri(built), versionAsOf=version)) == rows(ours)
    at = built.before_correction
    assert at is not None
    stamp = at.strftime("%Y-%m-%d %H:%M:%S.%f")  # the session's time zone is UTC
    then = engine.raw.read_arrow(spec, table=engine.raw.table_at(spec, at))  # type: ignore[arg-type]
    assert rows(delta_read(spark, raw_uri(built), timestampAsOf=stamp)) == rows(then)
    assert rows(then) != rows(engine.raw.read_arrow(spec))  # type: ignore[arg-type]
    # A rollup's surface as of that time is what the project's as-of read says it was then.
    surface = engine.warehouse.surface_path("energy_daily")
    as_of = query_arrow(engine, "energy_daily", as_of=at)
    assert rows(as_of) != rows(query_arrow(engine, "energy_daily"))
    theirs = delta_read(spark, surface, timestampAsOf=stamp)
    assert rows(theirs, as_of.column_names) == rows(as_of)


def test_the_checkpoints_maintenance_writes_are_read(
    built: Built, spark: SparkSession, tmp_path: Path
) -> None:
    """Every table is checkpointed at its latest version, and delta-spark reads one table of each
    kind from its checkpoint: the archives, the control tables, and one rollup's rows, pointers
    and surface (the other levels' tables are written by the same code)."""
    wh, catalog = built.world.engine.warehouse, built.world.catalog
    first = next(iter(catalog.rollups))
    levels = {
        n: (wh.rollup_path(n), wh.genmap_path(n), wh.surface_path(n)) for n in catalog.rollups
    }
    other_levels = {u for n, paths in levels.items() if n != first for u in paths}
    uris = tables(built)
    assert set(levels[first]) <= set(uris)  # its pointer table too: it was recomputed
    for uri in uris:
        log = Path(uri) / "_delta_log"
        checkpoint = json.loads((log / "_last_checkpoint").read_text())["version"]
        assert checkpoint == DeltaTable(uri).version(), uri
        if uri in other_levels:
            continue
        # A copy whose log starts at the checkpoint (delta-spark wants that version's commit
        # too, for its time): the commits alone no longer hold the table's files.
        copy = tmp_path / Path(uri).name
        shutil.copytree(uri, copy)
        for commit in (copy / "_delta_log").glob("*.json"):
            if int(commit.stem) < checkpoint:
                commit.unlink()
        assert [c.name for c in (copy / "_delta_log").glob("*.json")] == [f"{checkpoint:020d}.json"]
        ours = DeltaTable(uri).to_pyarrow_table()
        assert rows(delta_read(spark, str(copy))) == rows(ours), uri


def test_an_asset_of_yours_reads_a_rollup_through_delta_spark(
    built: Built, spark: SparkSession
) -> None:
    """The example of `SparkResource`'s docstring, run as it is written there."""
    import dagster as dg
    from delta.tables import DeltaTable as SparkDeltaTable

    from rollup_assets.orchestration.resources import SparkResource, WarehouseResource

    seen: dict = {}

    @dg.asset(deps=["energy_daily"])
    def daily_peaks(spark: SparkResource, warehouse: WarehouseResource) -> None:
        path = spark_uri(warehouse.get().surface_path("energy_daily"))
        daily = spark.session.read.format("delta").load(path)
        seen["peaks"] = dict(daily.groupBy("entity_id").max("current_a_max").collect())
        seen["history"] = SparkDeltaTable.forPath(spark.session, path).history(5).collect()

    root = built.world.engine.warehouse.root
    result = dg.materialize(
        [daily_peaks],
        resources={"spark": SparkResource(), "warehouse": WarehouseResource(root=root)},
    )
    assert result.success
    queried = query_arrow(built.world.engine, "energy_daily")
    peaks = queried.group_by("entity_id").aggregate([("current_a_max", "max")]).to_pylist()
    assert seen["peaks"] == {r["entity_id"]: r["current_a_max_max"] for r in peaks}
    latest = DeltaTable(built.world.engine.warehouse.surface_path("energy_daily")).version()
    assert [r["version"] for r in seen["history"]] == list(range(latest, max(latest - 5, -1), -1))
