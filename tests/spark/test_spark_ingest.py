"""The Spark ingest (delta-spark's MERGE on the executors) against the delta-rs ingest on the
driver: the same batches leave the same rows, the same change feed and the same commit metadata,
classified alike by change detection; a bad row is refused with the same index and reason, and
nothing is written."""

import json
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources.change_feed import read_changes
from rollup_assets.resources.delta_tables import with_user_metadata
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.spark_batches import read_file
from rollup_assets.resources.spark_ingest import ingest_frame
from rollup_assets.resources.warehouse import Warehouse

ENERGY = load_catalog().raw["energy_raw"]
DAY = date(2025, 3, 3)


def store(root: Path) -> RawStore:
    raw = RawStore(Warehouse(str(root)))
    raw.ensure_table(ENERGY)
    return raw


def stored(raw: RawStore) -> list[dict]:
    table = pa.table(DeltaTable(raw.uri(ENERGY)).to_pyarrow_table())
    names = [f.name for f in table.schema]
    plain = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in table.schema]
    )
    return (
        table.cast(plain)
        .select(names)
        .sort_by([("entity_id", "ascending"), ("ts", "ascending")])
        .to_pylist()
    )


def commit(raw: RawStore, version: int) -> tuple[dict, list[dict]]:
    """A commit's `rollups.*` metadata and its change feed rows."""
    table = DeltaTable(raw.uri(ENERGY))
    info = next(with_user_metadata(c) for c in table.history() if c["version"] == version)
    metadata = {k: v for k, v in info.items() if k.startswith("rollups.")}
    feed = pa.table(table.load_cdf(starting_version=version, ending_version=version))
    feed = feed.drop_columns(["_commit_version", "_commit_timestamp"])
    plain = pa.schema(
        [f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in feed.schema]
    )
    rows = feed.cast(plain).to_pylist()
    return metadata, sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


def summary(result: IngestResult) -> tuple:
    return (
        result.rows,
        result.inserted,
        result.updated,
        result.entities,
        result.min_ts,
        result.max_ts,
        result.change_source,
    )


def corrections(first: pa.Table) -> pa.Table:
    """Changed, emptied, identical and new readings of `first`'s meters."""
    n = 12
    energy = first["energy_kwh"].to_pylist()
    power = first["power_kw"].to_pylist()
    voltage = first["voltage_v"].to_pylist()
    for i in range(0, n):  # a required value changes
        energy[i] = energy[i] * 2
    for i in range(n, 2 * n):  # an optional value left empty keeps the stored one
        power[i] = None
    for i in range(2 * n, 3 * n):  # an operand changes: the computed column follows
        voltage[i] = 210.0
    for i in range(3 * n, 4 * n):  # empty power, new voltage: computed from the stored power
        power[i], voltage[i] = None, 240.0
    changed = first.slice(0, 5 * n)  # the last 12 unchanged
    changed = changed.set_column(2, "energy_kwh", pa.array(energy[: 5 * n]))
    changed = changed.set_column(3, "power_kw", pa.array(power[: 5 * n], pa.float64()))
    changed = changed.set_column(4, "voltage_v", pa.array(voltage[: 5 * n], pa.float64()))
    late = day_batch(DAY, 2, seed=11).slice(0, 6)
    late = late.set_column(1, "ts", pc.add(late["ts"], pa.scalar(timedelta(minutes=5))))
    return pa.concat_tables([changed, late])


def test_the_spark_ingest_writes_what_the_driver_ingest_writes(
    spark: SparkSession, tmp_path: Path
) -> None:
    driver, executors = store(tmp_path / "driver"), store(tmp_path / "executors")
    first = pa.concat_tables(
        [day_batch(DAY + timedelta(days=i), 3, seed=5, null_power=0.2) for i in range(2)]
    )
    batches = [first, corrections(first), corrections(first)]  # the last changes nothing
    sources = [ChangeSource.IMPORT, ChangeSource.MANUAL, ChangeSource.PIPELINE]
    for i, (batch, source) in enumerate(zip(batches, sources, strict=True)):
        path = tmp_path / f"batch-{i}.parquet"
        pq.write_table(batch, path)
        before = DeltaTable(executors.uri(ENERGY)).version()
        ours = driver.ingest(ENERGY, path, source)
        theirs = ingest_frame(
            executors, spark, ENERGY, read_file(spark, ENERGY, path), source, file=path.name
        )
        assert summary(theirs) == summary(ours), i
        assert stored(executors) == stored(driver), i
        if i == 2:  # identical rows are not rewritten: no commit at all
            assert theirs.version == before and (theirs.inserted, theirs.updated) == (0, 0)
            continue
        assert theirs.version == before + 1
        metadata, feed = commit(executors, theirs.version)
        assert metadata.pop("rollups.ingest_id")
        expected_metadata, expected_feed = commit(driver, ours.version)
        assert metadata == expected_metadata
        assert feed == expected_feed  # only the rows that changed, with both images
        # Change detection reads the commit as it reads the driver's.
        found = read_changes(executors, ENERGY, theirs.version, 1_000_000)
        expected = read_changes(driver, ENERGY, ours.version, 1_000_000)
        assert found is not None and expected is not None
        assert found.change_source is source and expected.change_source is source
        assert found.rows is not None and expected.rows is not None
        key = [("entity_id", "ascending"), ("ts", "ascending")]
        assert found.rows.sort_by(key).to_pylist() == expected.rows.sort_by(key).to_pylist()
    assert len(stored(executors)) == first.num_rows + 6


def readings_csv(rows: int) -> list[dict]:
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    return [
        {
            "entity_id": f"m{i % 3}",
            "ts": (t0 + timedelta(minutes=15 * (i // 3))).isoformat().replace("+00:00", "Z"),
            "energy_kwh": f"{1 + i / 10}",
            "power_kw": f"{2 + i / 10}",
            "voltage_v": "230",
        }
        for i in range(rows)
    ]


def as_csv(rows: list[dict], header: str = "entity_id,ts,energy_kwh,power_kw,voltage_v") -> str:
    cells = header.split(",")
    return (
        header + "\n" + "".join(",".join(str(r.get(c) or "") for c in cells) + "\n" for r in rows)
    )


CASES = [
    pytest.param({25: {"voltage_v": "x"}, 31: {"entity_id": None}}, id="text-in-optional"),
    pytest.param({31: {"ts": "never"}, 28: {"voltage_v": "inf"}}, id="infinite-first"),
    pytest.param({33: {"energy_kwh": None}, 29: {"key": 3}}, id="duplicate-first"),
    pytest.param({12: {"energy_kwh": None}, 35: {"key": 3}}, id="null-before-duplicate"),
    pytest.param({30: {"key": 2}}, id="duplicate"),
    pytest.param({38: {"ts": "2025-01-01T01:00:00+01:00", "entity_id": "m0"}}, id="same-instant"),
    pytest.param({20: {"entity_id": "   "}}, id="blank-entity"),
]


@pytest.mark.parametrize("overrides", CASES)
def test_a_bad_row_is_refused_as_the_driver_refuses_it(
    spark: SparkSession, tmp_path: Path, overrides: dict
) -> None:
    rows = readings_csv(40)
    for k, values in overrides.items():
        if "key" in values:
            rows[k]["entity_id"], rows[k]["ts"] = (
                rows[values["key"]]["entity_id"],
                rows[values["key"]]["ts"],
            )
        else:
            rows[k].update(values)
    path = tmp_path / "bad.csv"
    path.write_text(as_csv(rows))
    with pytest.raises(IngestValidationError) as on_driver:
        store(tmp_path / "driver").ingest(ENERGY, path, ChangeSource.PIPELINE)
    executors = store(tmp_path / "executors")
    # Small splits: the file's rows reach Spark in several partitions.
    spark.conf.set("spark.sql.files.maxPartitionBytes", "400")
    try:
        frame = read_file(spark, ENERGY, path)
        assert frame.rdd.getNumPartitions() >= 3
        with pytest.raises(IngestValidationError) as on_executors:
            ingest_frame(executors, spark, ENERGY, frame, ChangeSource.PIPELINE, file=path.name)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert str(on_executors.value) == str(on_driver.value)
    assert DeltaTable(executors.uri(ENERGY)).version() == 0  # nothing was written


def test_a_file_that_is_not_well_formed_is_refused_whole(
    spark: SparkSession, tmp_path: Path
) -> None:
    rows = readings_csv(40)
    text = as_csv(rows).splitlines()
    text[31] += ",12"  # row 30 has a decimal comma: one field too many
    path = tmp_path / "comma.csv"
    path.write_text("\n".join(text) + "\n")
    with pytest.raises(IngestValidationError) as on_driver:
        store(tmp_path / "driver").ingest(ENERGY, path, ChangeSource.PIPELINE)
    executors = store(tmp_path / "executors")
    spark.conf.set("spark.sql.files.maxPartitionBytes", "400")  # rows in several partitions
    try:
        with pytest.raises(IngestValidationError) as on_executors:
            ingest_frame(
                executors,
                spark,
                ENERGY,
                read_file(spark, ENERGY, path),
                ChangeSource.PIPELINE,
                file=path.name,
            )
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
    assert on_driver.value.row is None and on_executors.value.row is None
    assert "comma.csv is not a readable CSV file (its row 30 " in str(on_executors.value)
    assert DeltaTable(executors.uri(ENERGY)).version() == 0
    # Columns the archive does not declare, or a computed one supplied: the same refusal.
    for header in ("entity_id,ts,energy_kwh,watts", "entity_id,ts,energy_kwh,current_a"):
        path.write_text(as_csv(rows, header))
        with pytest.raises(IngestValidationError) as on_driver:
            store(tmp_path / "driver").ingest(ENERGY, path, ChangeSource.PIPELINE)
        with pytest.raises(IngestValidationError) as on_executors:
            ingest_frame(
                executors, spark, ENERGY, read_file(spark, ENERGY, path), ChangeSource.PIPELINE
            )
        assert str(on_executors.value) == str(on_driver.value)


def test_rollups_ingest_with_spark(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from rollup_assets.cli import app as cli
    from rollup_assets.cli import main
    from rollup_assets.services.engine import Engine
    from rollup_assets.services.operations import Operations

    (tmp_path / "home").mkdir()
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROLLUPS_SPECS", raising=False)
    for cached in (cli.settings, cli.catalog, cli.engine):
        cached.cache_clear()
    Operations(Engine(load_catalog(), Warehouse(str(tmp_path / "warehouse")))).activate(
        "energy_raw", now=datetime(2025, 3, 6, tzinfo=UTC)
    )
    path = tmp_path / "readings.csv"
    path.write_text(as_csv(readings_csv(12)))
    try:
        res = CliRunner().invoke(
            main, ["ingest", "energy_raw", str(path), "--spark", "--format", "json"]
        )
    finally:
        for cached in (cli.settings, cli.catalog, cli.engine):
            cached.cache_clear()
    assert res.exit_code == 0, res.output
    (out,) = json.loads(res.stdout)
    assert (out["rows"], out["inserted"], out["updated"]) == (12, 12, 0)
    table = DeltaTable(str(tmp_path / "warehouse" / "raw" / "energy_raw"))
    assert table.history(1)[0]["operation"] == "MERGE"
    assert table.to_pyarrow_table().num_rows == 12
