"""`rollups export/import/backup/restore` from the command line (no Spark): data out and back in,
and one-line refusals."""

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.cli import app as cli
from rollup_assets.demo.sample_data import SCHEMA
from tests.unit.test_cli import Invoke, as_json, assert_one_line_failure, rollups  # noqa: F401


def test_export_import_backup_and_restore_from_the_command_line(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = tmp_path / "batch.parquet"
    rows = [
        {"entity_id": f"m{m}", "ts": datetime(2025, 6, 1, h, tzinfo=UTC), "energy_kwh": h + m}
        for m in range(2)
        for h in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), batch)
    as_json(rollups("activate", "energy_raw", "--format", "json"))
    as_json(rollups("activate", "energy_hourly", "--format", "json"))
    as_json(rollups("ingest", "energy_raw", batch, "--format", "json"))

    out = tmp_path / "export" / "m1.parquet"
    [exported] = as_json(
        rollups(
            "export",
            "energy_raw",
            out,
            "--entity",
            "m1",
            "--from",
            "2025-06-01T01:00:00Z",
            "--format",
            "json",
        )
    )
    assert (exported["rows"], exported["kind"], exported["from"]) == (
        3,
        "raw",
        "2025-06-01T01:00:00Z",
    )
    assert pq.read_table(out)["entity_id"].to_pylist() == ["m1"] * 3
    [imported] = as_json(rollups("import", "energy_raw", out, "--format", "json"))
    assert (imported["rows"], imported["unchanged"], imported["exported_from"]) == (
        3,
        3,
        "energy_raw",
    )

    hourly = tmp_path / "hourly.parquet"
    as_json(rollups("export", "energy_hourly", hourly, "--format", "json"))
    assert_one_line_failure(rollups("import", "energy_raw", hourly), "rollup rows are derived")
    assert_one_line_failure(rollups("import", "energy_hourly", out), "written by the system")

    saved = tmp_path / "backup"
    tables = as_json(rollups("backup", saved, "--format", "json"))
    assert {t["table"] for t in tables} == {"raw/energy_raw", "_control/archives"}
    assert_one_line_failure(rollups("backup", saved), "is not empty")
    assert_one_line_failure(rollups("restore", saved), "is not empty")
    assert_one_line_failure(rollups("restore", tmp_path / "export"), "no manifest.json")

    before = as_json(rollups("query", "energy_raw", "--format", "json"))
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "restored"))
    cli.engine.cache_clear()
    cli.settings.cache_clear()
    restored = as_json(rollups("restore", saved, "--format", "json"))
    assert [(t["table"], t["version"]) for t in restored] == [
        (t["table"], t["version"]) for t in tables
    ]
    assert as_json(rollups("query", "energy_raw", "--format", "json")) == before
    assert len(before) == 8


def test_restore_and_import_refuse_files_altered_at_the_same_size_in_one_line(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    batch = tmp_path / "batch.parquet"
    rows = [
        {"entity_id": "m1", "ts": datetime(2025, 6, 1, h, tzinfo=UTC), "energy_kwh": float(h)}
        for h in range(4)
    ]
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), batch)
    as_json(rollups("activate", "energy_raw", "--format", "json"))
    as_json(rollups("ingest", "energy_raw", batch, "--format", "json"))
    saved, out = tmp_path / "backup", tmp_path / "raw.parquet"
    as_json(rollups("backup", saved, "--format", "json"))
    as_json(rollups("export", "energy_raw", out, "--format", "json"))
    for path in (next((saved / "tables" / "raw" / "energy_raw").rglob("part-*.parquet")), out):
        data = bytearray(path.read_bytes())
        data[10] ^= 0x01  # same size, one bit changed in the first column's pages
        path.write_bytes(bytes(data))

    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "restored"))
    cli.engine.cache_clear()
    cli.settings.cache_clear()
    assert_one_line_failure(
        rollups("restore", saved), "of table raw/energy_raw does not match its checksum"
    )
    assert not (tmp_path / "restored").exists()
    as_json(rollups("activate", "energy_raw", "--format", "json"))
    assert_one_line_failure(
        rollups("import", "energy_raw", out), "does not match the checksum its export recorded"
    )
    assert as_json(rollups("query", "energy_raw", "--format", "json")) == []
