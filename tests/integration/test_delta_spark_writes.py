"""The project on raw tables delta-spark writes: an upstream Spark job's MERGE of corrections
and its DELETE reach every level (equal to the pandas oracle over the rows delta-spark reads);
deletion vectors are read right or refused, never read wrong; and delta-rs ingests racing
delta-spark MERGEs on one table lose no commit.

The tests share one installation (built once for the module, left settled and equal to the
oracle by each test); the deletion-vector test comes last, as it changes the table's protocol.
delta-spark rebuilds a table's state in two partitions here, one per core of the local session
(`small_snapshots` of the reading tests).
"""

import threading
import time
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable as RsTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.jobs import ChangeSource, JobState
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.runner import tick_until_quiet
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse, spark_uri
from tests.conftest import World, days, world_of
from tests.integration.test_delta_spark_reads import small_snapshots
from tests.oracle import compare_all, oracle, raw_frame

NOW = datetime(2025, 3, 6, 12, tzinfo=UTC)
# The days the tests change: 27 and 28 February, 1 March (across a month end), and 2 March, which
# a deletion vector leaves alone.
FIRST = date(2025, 2, 27)
DAYS = 4
METERS = 3
KEYS = "t.day = s.day AND t.entity_id = s.entity_id AND t.ts = s.ts"


@pytest.fixture(scope="module", autouse=True)
def _small_snapshots(spark: SparkSession) -> Iterator[None]:
    with small_snapshots(spark):
        yield


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory, spark: SparkSession) -> Iterator[World]:
    with pytest.MonkeyPatch.context() as mp:
        for w in world_of(tmp_path_factory.mktemp("delta-spark-writes"), mp, load_catalog()):
            w.ops.activate("energy_raw", now=NOW)
            w.ingest(pa.concat_tables([day_batch(d, METERS, seed=9) for d in days(FIRST, DAYS)]))
            w.activate_all(NOW)
            start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
            w.backfill([Window(start, start + timedelta(days=DAYS))])
            w.tick(NOW)
            yield w


def raw_uri(world: World) -> str:
    return world.engine.raw.uri(world.catalog.archive("energy_raw"))


def delta_raw(spark: SparkSession, world: World) -> pd.DataFrame:
    """The raw rows as delta-spark reads them, for the oracle."""
    spec = world.catalog.archive("energy_raw")
    table = spark.read.format("delta").load(spark_uri(raw_uri(world))).toArrow()
    return raw_frame(table, spec)  # type: ignore[arg-type]


def as_raw_rows(spark: SparkSession, readings: pa.Table) -> DataFrame:
    """Readings as an upstream Spark job writes them into the raw table: the computed column
    by the spec's formula, the UTC day it is partitioned by."""
    df = spark.createDataFrame(readings)
    amps = F.when(F.col("voltage_v") != 0, F.col("power_kw") * 1000 / F.col("voltage_v"))
    return df.withColumn("current_a", amps).withColumn("day", F.to_date("ts"))


def spark_merge(spark: SparkSession, uri: str, rows: DataFrame, day: str | None = None) -> None:
    """Upsert `rows` by the archive's keys (only into UTC `day`, when given: a MERGE that
    names its partition conflicts only with commits to that partition)."""
    from delta.tables import DeltaTable

    keys = KEYS if day is None else f"t.day = DATE'{day}' AND {KEYS}"
    target = DeltaTable.forPath(spark, spark_uri(uri)).alias("t")
    merge = target.merge(rows.alias("s"), keys).whenMatchedUpdateAll().whenNotMatchedInsertAll()
    merge.execute()


def settle(world: World) -> list[str]:
    """Tick until quiet; the error of every run that failed."""
    reports = tick_until_quiet(world.defs, world.instance, NOW)
    return [str(r.error) for rep in reports for r in rep.runs if not r.success]


def test_spark_merged_corrections_and_deletes_reach_every_level(
    world: World, spark: SparkSession
) -> None:
    from delta.tables import DeltaTable

    uri = raw_uri(world)
    before = delta_raw(spark, world)
    # Corrections: one meter's day, tripled; late readings between the 15-minute slots.
    day = day_batch(date(2025, 2, 27), METERS, seed=9)
    day = day.filter(pc.equal(day["entity_id"], "meter-0001"))
    day = day.set_column(2, "energy_kwh", pc.multiply(day["energy_kwh"], 3.0))
    late = day_batch(date(2025, 3, 1), METERS, seed=4).slice(100, 6)
    late = late.set_column(1, "ts", pc.add(late["ts"], pa.scalar(timedelta(minutes=7))))
    spark_merge(spark, uri, as_raw_rows(spark, pa.concat_tables([day, late])))
    # A DELETE is a retraction: the rollups drop what the rows contributed.
    DeltaTable.forPath(spark, spark_uri(uri)).delete(
        "entity_id = 'meter-0002' AND ts >= '2025-02-28 05:00:00' AND ts < '2025-02-28 11:00:00'"
    )
    assert [c["operation"] for c in RsTable(uri).history(2)] == ["DELETE", "MERGE"]
    raw = delta_raw(spark, world)
    deleted = in_range(before, "meter-0002", "2025-02-28", 5, 11)
    assert len(raw) == len(before) + len(late) - len(deleted) and len(deleted) > 0
    assert compare_all(world.query, raw, world.catalog) != []  # the rollups are behind
    assert settle(world) == []
    assert compare_all(world.query, raw, world.catalog) == []


def in_range(raw: pd.DataFrame, entity: str, day: str, first_hour: int, end_hour: int):  # type: ignore[no-untyped-def]
    """The rows of `raw` of `entity` on UTC `day` from `first_hour` up to `end_hour`."""
    start = pd.Timestamp(day, tz="UTC")
    ts = raw["ts"]
    return raw[
        (raw["entity_id"] == entity)
        & (ts >= start + pd.Timedelta(hours=first_hour))
        & (ts < start + pd.Timedelta(hours=end_hour))
    ]


def test_racing_delta_rs_ingests_and_delta_spark_merges_lose_no_commit(
    tmp_path: Path, spark: SparkSession
) -> None:
    spec = load_catalog().archive("energy_raw")
    store = RawStore(Warehouse(str(tmp_path / "warehouse")))
    store.ensure_table(spec)  # type: ignore[arg-type]
    uri = store.uri(spec)  # type: ignore[arg-type]
    days_ = [day_batch(d, 1, seed=1).slice(0, 8) for d in (date(2025, 2, 27), date(2025, 2, 28))]
    merges = 2
    ingested: list[tuple[int, str]] = []  # (version the ingest returned, its entity)
    merged: list[str] = []
    conflicts: list[str] = []
    errors: list[BaseException] = []
    spark_done = threading.Event()
    signals = tmp_path / "signals"
    signals.mkdir()

    def batch(entity: str, day: int) -> pa.Table:
        rows = days_[day]
        return rows.set_column(0, "entity_id", pa.array([entity] * rows.num_rows))

    def visible(entity: str) -> bool:
        read = RsTable(uri).to_pyarrow_table(columns=["entity_id"])
        return entity in set(read["entity_id"].to_pylist())

    def ingest_one(i: int, day: int) -> None:
        path = tmp_path / f"rs-{i}.parquet"
        pq.write_table(batch(f"rs-{i}", day), path)
        done = store.ingest(spec, path, ChangeSource.PIPELINE)  # type: ignore[arg-type]
        ingested.append((done.version, f"rs-{i}"))

    def ingest() -> None:  # delta-rs, as `rollups ingest`, for as long as the MERGEs run
        try:
            i, last = 0, 0.0
            while not spark_done.is_set() and i < 200:
                # Into the MERGE's own partition when a MERGE, having read its snapshot, asks for
                # it: the race each MERGE then loses, every run. Into the other day's partition,
                # racing freely, every half second.
                asked = sorted(
                    p for p in signals.glob("*.asked") if not p.with_suffix(".done").exists()
                )
                if asked:
                    ingest_one(i, 0)
                    asked[0].with_suffix(".done").touch()
                elif time.monotonic() - last >= 0.5:
                    ingest_one(i, 1)
                    last = time.monotonic()
                else:
                    time.sleep(0.02)
                    continue
                i += 1
        except BaseException as exc:
            errors.append(exc)

    def meeting_an_ingest(rows: DataFrame, name: str) -> DataFrame:
        """`rows`, evaluated inside the MERGE's transaction: the first task to evaluate them
        asks for an ingest into the MERGE's partition and waits until it is committed."""
        asked, done = signals / f"{name}.asked", signals / f"{name}.done"

        def hold(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
            try:
                asked.open("x").close()
            except FileExistsError:
                pass  # another task or a retry: the ingest has been asked for
            else:
                deadline = time.monotonic() + 120
                while not done.exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"no ingest answered {asked}")
                    time.sleep(0.02)
            yield from batches

        return rows.mapInArrow(hold, rows.schema)

    def merge() -> None:  # an upstream Spark job, which retries a MERGE that conflicted
        try:
            for i in range(merges):
                rows = meeting_an_ingest(as_raw_rows(spark, batch(f"spark-{i}", 0)), f"merge-{i}")
                for attempt in range(10):
                    try:
                        spark_merge(spark, uri, rows, day="2025-02-27")
                        break
                    except Exception as exc:
                        if "Concurrent" not in f"{type(exc).__name__}: {exc}" or attempt == 9:
                            raise
                        conflicts.append(f"{type(exc).__name__}: {exc}"[:200])
                assert visible(f"spark-{i}")  # acknowledged: the other writer's reader sees it
                merged.append(f"spark-{i}")
        except BaseException as exc:
            errors.append(exc)
        finally:
            spark_done.set()

    threads = [threading.Thread(target=ingest), threading.Thread(target=merge)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    assert len(merged) == merges and len(ingested) >= merges
    # The writers met: each MERGE lost its race to the ingest it asked for and was retried.
    assert len(conflicts) == merges, conflicts
    history = sorted(RsTable(uri).history(), key=lambda c: c["version"])
    writers = [
        "rs" if c.get("rollups.operation") == "ingest" else "spark"
        for c in history
        if c["operation"] == "MERGE"
    ]
    # Every write is its own commit, and they interleaved: ingests committed between MERGEs.
    assert writers.count("rs") == len(ingested) and writers.count("spark") == merges
    first, last = writers.index("spark"), len(writers) - 1 - writers[::-1].index("spark")
    assert "rs" in writers[first:last], writers
    table = spark.read.format("delta").load(spark_uri(uri)).toArrow()
    counts = {c["values"]: c["counts"] for c in pc.value_counts(table["entity_id"]).to_pylist()}
    assert counts == {e: 8 for e in [*merged, *(e for _, e in ingested)]}
    # Each acknowledged ingest is in the version it returned.
    for version, entity in ingested:
        then = RsTable(uri, version=version).to_pyarrow_table(columns=["entity_id"])
        assert then["entity_id"].to_pylist().count(entity) == 8, version


def matching_cells(actual: pa.Table, expected: pd.DataFrame, spec: RollupSpec) -> set[tuple]:
    """The (entity, bucket start) cells of `actual` whose every value equals `expected`'s."""
    act = actual.to_pandas()
    act["bucket_start"] = pd.to_datetime(act["bucket_start"], utc=True)
    both = act.merge(expected, on=["entity_id", "bucket_start"], suffixes=("__a", "__e"))
    same = np.ones(len(both), dtype=bool)
    for name in spec.output_names:
        x = pd.to_numeric(both[f"{name}__a"], errors="coerce").astype(float).to_numpy()
        y = pd.to_numeric(both[f"{name}__e"], errors="coerce").astype(float).to_numpy()
        same &= (np.isnan(x) & np.isnan(y)) | np.isclose(x, y, rtol=1e-9, atol=1e-9)
    return set(zip(both["entity_id"][same], both["bucket_start"][same], strict=True))


def test_deletion_vectors_are_read_right_or_refused_never_wrong(
    world: World, spark: SparkSession
) -> None:
    from delta.tables import DeltaTable

    uri = raw_uri(world)
    spec = world.catalog.archive("energy_raw")
    spark.sql(
        f"ALTER TABLE delta.`{spark_uri(uri)}` "
        "SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')"
    )
    assert settle(world) == []  # a property change changes no row
    old = delta_raw(spark, world)
    DeltaTable.forPath(spark, spark_uri(uri)).delete(
        "entity_id = 'meter-0000' AND ts >= '2025-03-01 02:00:00' AND ts < '2025-03-01 04:00:00'"
    )
    deleted_at = RsTable(uri).version()
    carrying = pa.table(RsTable(uri).deletion_vectors())
    assert carrying.num_rows >= 1  # delta-spark deleted the rows with a deletion vector
    new = delta_raw(spark, world)
    removed = len(in_range(old, "meter-0000", "2025-03-01", 2, 4))
    assert 0 < len(old) - len(new) == removed

    # The project's file readers refuse, naming the archive and the feature.
    day = Window(datetime(2025, 3, 1, tzinfo=UTC), datetime(2025, 3, 2, tzinfo=UTC))
    with pytest.raises(UnsupportedTableFeatureError) as refused:
        world.engine.raw.read_rows(spec, [day], None)  # type: ignore[arg-type]
    assert "'energy_raw'" in str(refused.value) and "`deletionVectors`" in str(refused.value)
    assert "REORG TABLE" in str(refused.value)
    # Files without deletion vectors (the other days) read as before.
    other = Window(datetime(2025, 3, 2, tzinfo=UTC), datetime(2025, 3, 3, tzinfo=UTC))
    read, _ = world.engine.raw.read_rows(spec, [other], None)  # type: ignore[arg-type]
    expected = new[new["ts"] >= pd.Timestamp("2025-03-02", tz="UTC")]
    assert read.num_rows == len(expected) > 0
    # Its change reader gets exactly the deleted rows, as delta-spark's change feed has them.
    changes, _ = world.engine.raw.changes(spec, deleted_at - 1, deleted_at, [day], None)  # type: ignore[arg-type]
    feed = (
        spark.read.format("delta")
        .option("readChangeFeed", "true")
        .option("startingVersion", deleted_at)
        .load(spark_uri(uri))
        .toArrow()
    )
    assert feed.num_rows == changes.num_rows == removed
    assert set(pc.unique(changes["_change_type"]).to_pylist()) == {"delete"}
    names = changes.column_names
    key = [(c, "ascending") for c in ("entity_id", "ts")]
    assert changes.sort_by(key).to_pylist() == feed.select(names).sort_by(key).to_pylist()

    # The sensors: every run either applies the deletes right or fails naming the feature.
    marker = datetime.now(UTC)
    failures = settle(world)
    assert all("deletionVectors" in f for f in failures), failures
    for name in world.catalog.rollups:
        rollup = world.catalog.rollup(name)
        shown = world.query(name)
        right = matching_cells(shown, oracle(new, rollup), rollup)
        stale = matching_cells(shown, oracle(old, rollup), rollup)
        starts = pd.to_datetime(shown["bucket_start"].to_pandas(), utc=True)
        keys = set(zip(shown["entity_id"].to_pylist(), starts, strict=True))
        assert keys and keys <= right | stale, (name, sorted(keys - right - stale)[:3])
    failed = [
        j
        for name in world.catalog.rollups
        for j in world.engine.ledger.history(name)
        if j.state is JobState.FAILED and j.finished_at and j.finished_at >= marker
    ]
    assert all("deletionVectors" in (j.error or "") for j in failed)

    # Purged (the remedy the error names), a recompute of what failed brings every level right.
    spark.sql(f"REORG TABLE delta.`{spark_uri(uri)}` APPLY (PURGE)")
    assert pa.table(RsTable(uri).deletion_vectors()).num_rows == 0
    for job in failed:
        world.ops.request_recompute(
            job.rollup, min(w.start for w in job.windows), max(w.end for w in job.windows)
        )
    assert settle(world) == []
    assert compare_all(world.query, delta_raw(spark, world), world.catalog) == []
