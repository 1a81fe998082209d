"""Readings written from memory (`services.ingest.ingest`) against the same readings in a file:
a pandas DataFrame, a pyarrow Table, a RecordBatchReader and a Spark DataFrame leave the raw
table and its change feed (as the project reads it, `RawStore.changes`) exactly as the file
does, with the same result; a bad row is refused naming its position in the caller's data, and
the table's version does not move; a large stream is read as it is validated, never whole."""

import json
import tempfile
from dataclasses import replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

import rollup_assets.resources.batch_sources as batch_sources
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.commit_changes import CHANGE_TYPE, COMMIT_VERSION
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.ingest import Readings, ingest
from rollup_assets.services.operations import Operations

NOW = datetime(2025, 3, 6, 12, tzinfo=UTC)
DAY = date(2025, 3, 3)
MIDNIGHT = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC)
ROUTES = ("file", "pandas", "table", "stream", "spark")
EVERYTHING = Window(datetime(2000, 1, 1, tzinfo=UTC), datetime(2100, 1, 1, tzinfo=UTC))


def activated_engine(root: Path) -> Engine:
    engine = Engine(load_catalog(), Warehouse(str(root)))
    Operations(engine, actor="test").activate("energy_raw", now=NOW)
    return engine


def as_readings(route: str, rows: pa.Table, where: Path, spark: SparkSession) -> Readings:
    """`rows` as the caller of `route` holds them."""
    if route == "file":
        where.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(rows, where)
        return where
    if route == "pandas":
        frame = rows.to_pandas()
        frame.index = range(1000, 1000 + len(frame))  # a label is not a position
        return frame
    if route == "table":
        return rows
    if route == "stream":
        return pa.RecordBatchReader.from_batches(rows.schema, rows.to_batches(max_chunksize=37))
    return spark.createDataFrame(rows)


def version(engine: Engine) -> int:
    table = engine.raw.table(engine.catalog.raw["energy_raw"])
    assert table is not None
    return table.version()


def first_batch() -> pa.Table:
    return pa.concat_tables(
        [day_batch(DAY + timedelta(days=i), 3, seed=5, null_power=0.2) for i in range(2)]
    )


def corrections(first: pa.Table) -> pa.Table:
    """10 changed energies, 10 emptied powers (the stored ones stay), 10 new voltages, 10
    identical readings, and 6 new readings."""
    energy = first["energy_kwh"].to_pylist()[:40]
    power = first["power_kw"].to_pylist()[:40]
    voltage = first["voltage_v"].to_pylist()[:40]
    for i in range(10):
        energy[i] += 1.0
        power[10 + i] = None
        voltage[20 + i] = 210.0
    changed = first.slice(0, 40)
    changed = changed.set_column(2, "energy_kwh", pa.array(energy, pa.float64()))
    changed = changed.set_column(3, "power_kw", pa.array(power, pa.float64()))
    changed = changed.set_column(4, "voltage_v", pa.array(voltage, pa.float64()))
    late = day_batch(DAY, 2, seed=11).slice(0, 6)
    late = late.set_column(1, "ts", pc.add(late["ts"], pa.scalar(timedelta(minutes=5))))
    return pa.concat_tables([changed, late])


def stored(engine: Engine) -> list[dict]:
    rows = engine.raw.read_arrow(engine.catalog.raw["energy_raw"])
    return rows.sort_by([("entity_id", "ascending"), ("ts", "ascending")]).to_pylist()


def change_feed(engine: Engine, after: int) -> list[dict]:
    """Every row change after version `after`, each commit named by its order (1, 2, ...)."""
    spec = engine.catalog.raw["energy_raw"]
    changes, _ = engine.raw.changes(spec, after, version(engine), [EVERYTHING], None)
    order = {v: i + 1 for i, v in enumerate(sorted(set(changes[COMMIT_VERSION].to_pylist())))}
    rows = [{**r, COMMIT_VERSION: order[r[COMMIT_VERSION]]} for r in changes.to_pylist()]
    return sorted(rows, key=lambda r: json.dumps(r, default=str, sort_keys=True))


def summary(result: IngestResult) -> tuple:
    return (
        result.rows,
        result.inserted,
        result.updated,
        result.unchanged,
        result.entities,
        result.min_ts,
        result.max_ts,
        result.change_source,
    )


def test_every_route_leaves_the_rows_and_change_feed_a_file_leaves(
    spark: SparkSession, tmp_path: Path
) -> None:
    first = first_batch()
    batches = [first, corrections(first)]
    sources = [ChangeSource.IMPORT, ChangeSource.MANUAL]
    tables, feeds, results = {}, {}, {}
    for route in ROUTES:
        engine = activated_engine(tmp_path / route)
        provisioned = version(engine)
        results[route] = [
            summary(ingest(engine, "energy_raw", as_readings(route, b, path, spark), source))
            for i, (b, source) in enumerate(zip(batches, sources, strict=True))
            for path in [tmp_path / "landing" / f"{route}-{i}.parquet"]
        ]
        tables[route], feeds[route] = stored(engine), change_feed(engine, provisioned)

    # The file ingest, against an oracle of its own: the second batch's energies win, and the
    # change feed holds every first row inserted, then 20 updates and 6 inserts.
    expected = first.to_pandas().set_index(["entity_id", "ts"])["energy_kwh"]
    second = batches[1].to_pandas().set_index(["entity_id", "ts"])["energy_kwh"]
    expected = pd.concat([expected.drop(second.index, errors="ignore"), second]).sort_index()
    got = pd.DataFrame(tables["file"]).set_index(["entity_id", "ts"])["energy_kwh"]
    pd.testing.assert_series_equal(got.sort_index(), expected, check_index_type=False)
    kinds = pd.Series([(r[COMMIT_VERSION], r[CHANGE_TYPE]) for r in feeds["file"]])
    assert kinds.value_counts().to_dict() == {
        (1, "insert"): first.num_rows,
        (2, "update_preimage"): 20,
        (2, "update_postimage"): 20,
        (2, "insert"): 6,
    }
    assert results["file"][1][:4] == (46, 6, 20, 20)

    for route in ROUTES[1:]:
        assert results[route] == results["file"], route
        assert tables[route] == tables["file"], route
        assert feeds[route] == feeds["file"], route


def with_bad_row(case: str, rows: pa.Table) -> tuple[pa.Table, int, str]:
    """`rows` with one bad row (for `case`), its position and what the refusal says."""
    values = rows.to_pydict()
    if case == "null entity":
        values["entity_id"][17] = None
        return pa.table(values, schema=rows.schema), 17, "entity_id is null"
    if case == "bad timestamp":
        text = [t.isoformat() for t in values["ts"]]
        text[23] = "yesterday at noon"
        bad = rows.set_column(1, "ts", pa.array(text, pa.string()))
        return bad, 23, "is not an ISO-8601 timestamp"
    if case == "wrong type":
        text = [None if v is None else str(v) for v in values["energy_kwh"]]
        text[31] = "abc"
        bad = rows.set_column(2, "energy_kwh", pa.array(text, pa.string()))
        return bad, 31, "energy_kwh value 'abc' is not a number"
    if case == "duplicate key":
        for column in values:
            values[column][40] = values[column][5]
        return pa.table(values, schema=rows.schema), 40, "duplicate key"
    assert case == "before retention"
    values["ts"][44] = MIDNIGHT - timedelta(days=1)
    return pa.table(values, schema=rows.schema), 44, "retention has dropped those days"


CASES = ["null entity", "bad timestamp", "wrong type", "duplicate key", "before retention"]


@pytest.mark.parametrize("route", ROUTES)
def test_a_bad_row_is_refused_by_its_position_and_nothing_is_written(
    route: str, spark: SparkSession, tmp_path: Path
) -> None:
    engine = activated_engine(tmp_path / "warehouse")
    ingest(engine, "energy_raw", first_batch(), ChangeSource.IMPORT)
    engine.states.update(
        "energy_raw", lambda s: replace(s, retained_from=MIDNIGHT), reason="test", actor="test"
    )
    before, rows = version(engine), stored(engine)
    # The Spark ingest checks retention for the batch as a whole (no row named).
    cases = CASES[:-1] if route == "spark" else CASES
    for case in cases:
        bad, row, reason = with_bad_row(case, corrections(first_batch()))
        data = as_readings(route, bad, tmp_path / "landing" / f"{case}.parquet", spark)
        with pytest.raises(IngestValidationError) as refused:
            ingest(engine, "energy_raw", data, ChangeSource.MANUAL)
        assert (case, refused.value.row) == (case, row)
        assert reason in refused.value.reason, case
        assert f"row {row}" in str(refused.value) and "nothing was written" in str(refused.value)
        assert version(engine) == before, case
    assert stored(engine) == rows


def test_a_mixed_pandas_column_is_refused_at_its_first_bad_value(tmp_path: Path) -> None:
    engine = activated_engine(tmp_path / "warehouse")
    frame = first_batch().to_pandas()
    frame["energy_kwh"] = frame["energy_kwh"].astype(object)
    frame.loc[12, "energy_kwh"] = "12,5"  # text among floats: Arrow cannot hold the column
    with pytest.raises(IngestValidationError) as refused:
        ingest(engine, "energy_raw", frame, ChangeSource.MANUAL)
    assert refused.value.row == 12 and "'12,5' is not a number" in refused.value.reason
    assert version(engine) == 0


def test_a_stream_is_validated_as_it_is_read_and_its_spill_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_sources, "CHUNK_ROWS", 64)
    spill = tmp_path / "tmp"
    spill.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spill))
    engine = activated_engine(tmp_path / "warehouse")
    rows = first_batch()
    validated: list[int] = []
    pulled: list[tuple[int, int]] = []  # (rows handed out before, rows validated by then)

    def batches():
        handed = 0
        for batch in rows.to_batches(max_chunksize=64):
            pulled.append((handed, max(validated, default=0)))
            handed += batch.num_rows
            yield batch

    stream = pa.RecordBatchReader.from_batches(rows.schema, batches())
    progress = lambda stage, n: validated.append(n) if stage == "validated" else None  # noqa: E731
    result = ingest(engine, "energy_raw", stream, ChangeSource.IMPORT, progress=progress)
    assert result.inserted == rows.num_rows
    assert len(pulled) > 3
    # Each batch was asked for only once every row before it had been validated.
    assert all(seen == handed for handed, seen in pulled), pulled
    assert list(spill.iterdir()) == []
    keys = sorted(
        zip(*[rows[c].to_pylist() for c in ("entity_id", "ts", "energy_kwh")], strict=True)
    )
    assert [(r["entity_id"], r["ts"], r["energy_kwh"]) for r in stored(engine)] == keys
