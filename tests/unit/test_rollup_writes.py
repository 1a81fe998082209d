"""Rows written on the driver (a correction's differences, a fold's bases): one file per storage
partition they lie in, the partitions written side by side; a write that fails in one partition
leaves no file of the others behind."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

import rollup_assets.resources.delta_files as delta_files
import rollup_assets.resources.rollup_writes as rollup_writes
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine

HOUR = timedelta(hours=1)
# Hours over six UTC days (the hourly level is stored per UTC day), two meters each.
STARTS = [datetime(2025, 1, 28, 22, tzinfo=UTC) + k * 25 * HOUR for k in range(6)]


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    return Engine(load_catalog(), Warehouse(str(tmp_path / "warehouse")))


def rows(engine: Engine) -> pa.Table:
    spec = engine.catalog.rollup("energy_hourly")
    out = []
    for start in STARTS:
        for entity in ("meter-b", "meter-a"):
            row: dict = {"entity_id": entity, "bucket_start": start, "bucket_end": start + HOUR}
            for c in spec.stored_columns:
                row[c.name] = 4 if c.partial == "count" else 1.5
            out.append(row)
    return pa.Table.from_pylist(out)


def write(engine: Engine, table: pa.Table):  # type: ignore[no-untyped-def]
    spec = engine.catalog.rollup("energy_hourly")
    return engine.rollups.write_rows(
        table, spec, generation=3, job_id="j", run_id="r", source_versions={"energy_raw": 1}
    )


def parquet_files(engine: Engine) -> list[Path]:
    root = Path(engine.rollups.uri(engine.catalog.rollup("energy_hourly")))
    return sorted(root.rglob("*.parquet")) if root.exists() else []


def test_each_partition_gets_its_file(engine: Engine) -> None:
    written = write(engine, rows(engine))
    assert written.rows == 12
    parts = sorted(a.partition_values["bucket_part"] for a in written.adds)
    assert parts == [
        "2025-01-28",
        "2025-01-29",
        "2025-01-31",
        "2025-02-01",
        "2025-02-02",
        "2025-02-03",
    ]
    assert len(parquet_files(engine)) == 6


def test_a_partition_that_fails_leaves_no_file_of_the_others(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = rollup_writes.build_file_writer

    def failing(*args, **kwargs):  # type: ignore[no-untyped-def]
        writer = real(*args, **kwargs)

        def write_batches(batches):  # type: ignore[no-untyped-def]
            batches = list(batches)
            if any("2025-01-31" in b.column("bucket_part").to_pylist() for b in batches):
                raise OSError("disk full in 2025-01-31")
            yield from writer(iter(batches))

        return write_batches

    monkeypatch.setattr(rollup_writes, "build_file_writer", failing)
    with pytest.raises(OSError, match="disk full"):
        write(engine, rows(engine))
    assert parquet_files(engine) == []


def test_a_partition_that_fails_after_writing_its_file_deletes_it_too(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = delta_files.describe_written

    def describe(rel, size, md, partition):  # type: ignore[no-untyped-def]
        if "2025-01-31" in rel:
            raise OSError("lost the footer of 2025-01-31")
        return real(rel, size, md, partition)

    monkeypatch.setattr(delta_files, "describe_written", describe)
    with pytest.raises(OSError, match="lost the footer"):
        write(engine, rows(engine))
    assert parquet_files(engine) == []


def test_each_file_is_described_as_its_footer_read_back_describes_it(engine: Engine) -> None:
    """The writer describes each file from the footer it wrote (size, row count, statistics of
    every type, nulls and NaN included): the same entry as reading the file back."""
    table = rows(engine)
    value = next(c.name for c in engine.catalog.rollup("energy_hourly").stored_columns)
    values = [float("nan"), None, *([2.5] * (table.num_rows - 2))]
    table = table.set_column(
        table.schema.get_field_index(value), value, pa.array(values, pa.float64())
    )
    written = write(engine, table)
    root = engine.rollups.uri(engine.catalog.rollup("energy_hourly"))
    fs, base = delta_files.filesystem_for(root, None)
    for add in written.adds:
        again = delta_files.add_action(
            delta_files.describe_file(fs, base, add.path, add.partition_values)
        )
        assert (add.path, add.size, add.partition_values, add.stats) == (
            again.path,
            again.size,
            again.partition_values,
            again.stats,
        )
    assert sum(json.loads(a.stats)["numRecords"] for a in written.adds) == table.num_rows
