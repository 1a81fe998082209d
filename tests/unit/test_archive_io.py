"""Export and import of one archive's rows (delta-rs only, no Spark): an export imported into an
empty warehouse reads back the same rows; rollup rows and altered files are refused."""

import hashlib
import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.model.errors import IngestValidationError, InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.archive_io import (
    CHECKSUM_KEY,
    MANIFEST_KEY,
    export_archive,
    import_archive,
)
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations
from rollup_assets.services.query import query_arrow

T0 = datetime(2025, 3, 29, 22, 0, tzinfo=UTC)
CATALOG = parse_catalog(
    {
        "raw_archives": {
            "meter_raw": {
                "columns": {
                    "kwh": {"type": "double", "required": True},
                    "pulses": "long",
                    "note": "string",
                    # derived: exported with the rows, computed again (not supplied) on import
                    "per_pulse": {"type": "double", "formula": "kwh / pulses"},
                }
            }
        },
        "time_range_archives": {"tariff": {"period": "1h", "columns": {"price": "double"}}},
        "rollups": {
            "meter_hourly": {
                "source": "meter_raw",
                "alignment": "FixedSize",
                "size": "1h",
                "start": "2025-01-01",
                "reference_time_zone": "Europe/Vienna",
                "aggregations": [{"column": "kwh", "function": "Sum"}],
            }
        },
    }
)


def fresh(root: Path, catalog: Catalog = CATALOG) -> Engine:
    engine = Engine(catalog, Warehouse(str(root)))
    ops = Operations(engine, actor="test")
    for name in catalog.names():
        ops.activate(name, now=T0)
    return engine


def meter_rows() -> pa.Table:
    # Three meters over a DST night, with a null and a NaN-free optional column mix.
    rows = [
        {
            "entity_id": f"m{m}",
            "ts": T0 + timedelta(minutes=15 * i),
            "kwh": 0.25 * i + m,
            "pulses": None if i % 3 == 0 else i * 10 + m,
            "note": None if i % 2 else f"n{i}",
        }
        for m in range(3)
        for i in range(24)
    ]
    return pa.Table.from_pylist(
        rows,
        schema=pa.schema(
            [
                ("entity_id", pa.string()),
                ("ts", pa.timestamp("us", tz="UTC")),
                ("kwh", pa.float64()),
                ("pulses", pa.int64()),
                ("note", pa.string()),
            ]
        ),
    )


def tariff_rows() -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "entity_id": z,
                "range_start": T0 + timedelta(hours=h),
                "range_end": T0 + timedelta(hours=h + 1),
                "price": 0.1 * h,
            }
            for z in ("z1", "z2")
            for h in range(5)
        ]
    )


def ingest(engine: Engine, archive: str, table: pa.Table, path: Path) -> None:
    pq.write_table(table, path)
    engine.raw.ingest(
        engine.catalog.raw.get(archive) or engine.catalog.time_range[archive],
        path,
        ChangeSource.PIPELINE,
    )


@pytest.fixture
def source(tmp_path: Path) -> Engine:
    engine = fresh(tmp_path / "source")
    ingest(engine, "meter_raw", meter_rows(), tmp_path / "meter.parquet")
    ingest(engine, "tariff", tariff_rows(), tmp_path / "tariff.parquet")
    return engine


@pytest.mark.parametrize("archive", ["meter_raw", "tariff"])
def test_export_then_import_into_an_empty_warehouse_reads_the_same_rows(
    source: Engine, tmp_path: Path, archive: str
) -> None:
    out = tmp_path / "out" / f"{archive}.parquet"
    manifest = export_archive(source, archive, str(out))
    before = query_arrow(source, archive)
    assert manifest.rows == before.num_rows > 0
    assert manifest.source_versions == {
        archive: source.raw.table(source.catalog.archive(archive)).version()
    }

    target = fresh(tmp_path / "target")
    result = import_archive(target, archive, str(out))
    assert result.manifest == manifest
    assert result.ingest.inserted == before.num_rows
    assert query_arrow(target, archive).equals(before)
    if archive == "meter_raw":
        assert pq.read_schema(out).names.count("per_pulse") == 1
        assert before["per_pulse"].null_count < before.num_rows
    # Importing it again changes nothing: the rows are already there.
    again = import_archive(target, archive, str(out))
    assert again.ingest.unchanged == before.num_rows and again.ingest.inserted == 0


def test_an_export_of_a_range_and_entities_holds_exactly_those_rows(
    source: Engine, tmp_path: Path
) -> None:
    out = tmp_path / "part.parquet"
    start, end = T0 + timedelta(hours=1), T0 + timedelta(hours=3)
    manifest = export_archive(source, "meter_raw", str(out), start, end, ["m2", "m0"])
    data = pq.read_table(out)
    every = query_arrow(source, "meter_raw").to_pylist()
    expected = [r for r in every if start <= r["ts"] < end and r["entity_id"] in ("m0", "m2")]
    assert data.to_pylist() == expected and len(expected) == 16
    doc = json.loads(pq.read_schema(out).metadata[MANIFEST_KEY])
    assert doc["archive"] == "meter_raw" and doc["kind"] == "raw" and doc["rows"] == 16
    assert doc["from"] == "2025-03-29T23:00:00Z" and doc["entities"] == ["m0", "m2"]
    assert doc["columns"] == ["entity_id", "ts", "kwh", "pulses", "note", "per_pulse"]
    assert manifest.entities == ("m0", "m2")


def test_rollup_rows_are_not_imported(source: Engine, tmp_path: Path) -> None:
    out = tmp_path / "hourly.parquet"
    manifest = export_archive(source, "meter_hourly", str(out))
    assert manifest.kind == "rollup"
    with pytest.raises(InvalidArchiveOperationError, match="rollup rows are derived"):
        import_archive(source, "meter_raw", str(out))
    with pytest.raises(InvalidArchiveOperationError, match="rollup"):
        import_archive(source, "meter_hourly", str(tmp_path / "meter.parquet"))


def test_a_file_altered_after_export_is_refused_and_nothing_is_written(
    source: Engine, tmp_path: Path
) -> None:
    out = tmp_path / "meter.export.parquet"
    export_archive(source, "meter_raw", str(out))
    data = pq.read_table(out)
    pq.write_table(data.slice(0, 10), out)  # keeps the schema metadata, so the manifest too
    target = fresh(tmp_path / "target")
    with pytest.raises(
        IngestValidationError, match="holds 10 rows but its export manifest says 72"
    ):
        import_archive(target, "meter_raw", str(out))
    assert query_arrow(target, "meter_raw").num_rows == 0


def _kwh_chunk(path: Path) -> tuple[int, int]:
    """Where the `kwh` column's bytes of the first row group lie in `path`: (start, length)."""
    chunk = pq.read_metadata(path).row_group(0).column(2)
    assert chunk.path_in_schema == "kwh"
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    return start, chunk.total_compressed_size


def test_an_export_carries_the_sha256_of_its_bytes(source: Engine, tmp_path: Path) -> None:
    out = tmp_path / "meter.parquet"
    manifest = export_archive(source, "meter_raw", str(out))
    assert manifest.checksum == "sha256"
    recorded = pq.read_metadata(out).metadata[CHECKSUM_KEY]
    data = out.read_bytes()
    assert data.count(recorded) == 1 and len(recorded) == 64
    # The SHA-256 of the file as written, with 64 zeros where the checksum then went.
    zeroed = data.replace(recorded, b"0" * 64)
    assert hashlib.sha256(zeroed).hexdigest().encode() == recorded


def test_an_export_altered_in_place_at_the_same_size_is_refused_and_nothing_is_written(
    source: Engine, tmp_path: Path
) -> None:
    out = tmp_path / "meter.export.parquet"
    export_archive(source, "meter_raw", str(out))
    start, length = _kwh_chunk(out)
    data = bytearray(out.read_bytes())
    data[start + length // 2] ^= 0x01
    out.write_bytes(bytes(data))
    assert len(data) == out.stat().st_size
    target = fresh(tmp_path / "target")
    with pytest.raises(
        IngestValidationError, match="does not match the checksum its export recorded"
    ):
        import_archive(target, "meter_raw", str(out))
    assert query_arrow(target, "meter_raw").num_rows == 0


def test_an_export_rewritten_with_other_values_is_refused(source: Engine, tmp_path: Path) -> None:
    """Same rows, one value changed, written again with pyarrow (which keeps the manifest in
    the schema but not the checksum): the row count matches, the checksum is gone."""
    out = tmp_path / "meter.export.parquet"
    export_archive(source, "meter_raw", str(out))
    data = pq.read_table(out)
    kwh = data["kwh"].to_pylist()
    pq.write_table(data.set_column(2, "kwh", pa.array([kwh[0] + 1, *kwh[1:]])), out)
    assert MANIFEST_KEY in pq.read_schema(out).metadata
    target = fresh(tmp_path / "target")
    with pytest.raises(IngestValidationError, match="has lost the checksum"):
        import_archive(target, "meter_raw", str(out))
    assert query_arrow(target, "meter_raw").num_rows == 0


def test_an_export_of_an_older_release_without_a_checksum_is_imported_with_a_warning(
    source: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "old.parquet"
    export_archive(source, "meter_raw", str(out))
    data = pq.read_table(out)
    doc = json.loads(data.schema.metadata[MANIFEST_KEY])
    del doc["checksum"]  # as releases before checksums wrote it
    pq.write_table(data.replace_schema_metadata({MANIFEST_KEY: json.dumps(doc)}), out)
    target = fresh(tmp_path / "target")
    with caplog.at_level("WARNING", logger="rollup_assets.services.archive_io"):
        result = import_archive(target, "meter_raw", str(out))
    assert result.ingest.inserted == data.num_rows
    assert "old.parquet was exported by an older release and has no checksum" in caplog.text
