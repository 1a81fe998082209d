"""Backup and restore of a warehouse on delta-rs alone (no Spark): the restored warehouse reads
like the original (archive rows, archive states, ledger, change feed), and a restore that
cannot be right writes nothing."""

import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from rollup_assets.model.errors import (
    BackupError,
    BackupInvalidError,
    BackupSpecMismatchError,
    TargetNotEmptyError,
)
from rollup_assets.model.jobs import Job, Trigger
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_tables import commit_file
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services import backup as backups
from rollup_assets.services.backup import backup, consistent_versions, restore
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow
from tests.unit.test_archive_io import CATALOG, T0, fresh, ingest, meter_rows, tariff_rows


def populated(root: Path) -> Engine:
    """Activated archives, two ingests into each source, and a ledger with a job and a cursor."""
    engine = fresh(root / "warehouse")
    rows = meter_rows()
    ingest(engine, "meter_raw", rows.slice(0, 40), root / "a.parquet")
    ingest(engine, "meter_raw", rows.slice(30), root / "b.parquet")
    ingest(engine, "tariff", tariff_rows(), root / "t.parquet")
    window = Window(T0, T0.replace(hour=23))
    engine.ledger.record([Job("meter_hourly", Trigger.PERIODIC, (window,))], {"meter_raw": 1})
    return engine


def control(engine: Engine) -> tuple:
    return engine.states.all(), engine.ledger.snapshot()


def reads(engine: Engine) -> dict[str, pa.Table]:
    return {name: query_arrow(engine, name) for name in engine.catalog.names()}


def test_a_restore_into_an_empty_root_reads_like_the_original(tmp_path: Path) -> None:
    source = populated(tmp_path)
    manifest = backup(source, str(tmp_path / "backup"))
    paths = {t.path: t.version for t in manifest.tables}
    tables = ["_control/archives", "_control/ledger", "raw/meter_raw", "raw/tariff"]
    assert paths == {p: DeltaTable(source.warehouse.join(p)).version() for p in tables}
    assert (paths["raw/meter_raw"], paths["_control/ledger"]) == (2, 0)
    doc = json.loads((tmp_path / "backup" / "manifest.json").read_text())
    assert doc["format"] == "rollups-backup" and doc["format_version"] == 2
    assert doc["archives"]["meter_hourly"]["kind"] == "rollup"
    # Every file of the backup is listed with the SHA-256 of its bytes.
    for t in doc["tables"]:
        table = tmp_path / "backup" / "tables" / t["path"]
        files = {str(f.relative_to(table)): f for f in table.rglob("*") if f.is_file()}
        assert t["files"] == len(files) == len(t["sha256"]) > 0
        assert t["sha256"] == {
            rel: hashlib.sha256(f.read_bytes()).hexdigest() for rel, f in files.items()
        }

    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    restore(target, str(tmp_path / "backup"))
    assert control(target) == control(source)
    before = reads(source)
    assert reads(target) == before and before["meter_raw"].num_rows == 72
    # The change data feed of the raw tables answers as before (what detection reads).
    for name in ("meter_raw", "tariff"):
        src, dst = (e.raw.table(e.catalog.archive(name)) for e in (source, target))
        assert src is not None and dst is not None
        assert dst.metadata().id == src.metadata().id  # cursors name the table by its id
        assert changes(dst) == changes(src) != []


def changes(table: DeltaTable) -> list[tuple]:
    cdf = pa.table(table.load_cdf(starting_version=0, ending_version=table.version()))
    return sorted(
        (r["entity_id"], str(r["_change_type"]), r["_commit_version"], str(r.get("kwh")))
        for r in cdf.to_pylist()
    )


def test_a_backup_is_the_warehouse_as_of_one_instant(tmp_path: Path) -> None:
    source = populated(tmp_path)
    first = consistent_versions(source)
    assert first == consistent_versions(source)
    # A commit between the two passes (here, during the first one) makes the reading start over.
    calls = []
    real = backups._observe

    def observe_then_write(engine: Engine, paths: list[str]) -> dict[str, int]:
        seen = real(engine, paths)
        if not calls:
            engine.ledger.record(cursors={"tariff": 1})
        calls.append(seen)
        return seen

    backups._observe = observe_then_write  # type: ignore[assignment]
    try:
        versions = consistent_versions(source)
    finally:
        backups._observe = real  # type: ignore[assignment]
    assert len(calls) == 2 and versions["_control/ledger"] == first["_control/ledger"] + 1


def test_a_restore_refuses_a_warehouse_that_is_not_empty(tmp_path: Path) -> None:
    source = populated(tmp_path)
    backup(source, str(tmp_path / "backup"))
    with pytest.raises(TargetNotEmptyError, match="is not empty"):
        restore(source, str(tmp_path / "backup"))
    with pytest.raises(TargetNotEmptyError, match="backup directory"):
        backup(source, str(tmp_path / "backup"))


@pytest.mark.parametrize(
    ("damage", "error", "needle"),
    [
        (lambda d: (d / "manifest.json").unlink(), BackupInvalidError, "no manifest.json"),
        (lambda d: (d / "manifest.json").write_text("{nope"), BackupInvalidError, "not JSON"),
        (
            lambda d: edit(d, lambda m: m.update(format_version=99)),
            BackupInvalidError,
            "format version 99",
        ),
        (
            lambda d: edit(d, lambda m: m["tables"][0].update(path="../../etc")),
            BackupInvalidError,
            "not a warehouse table path",
        ),
        (
            lambda d: next((d / "tables" / "raw" / "meter_raw").rglob("*.parquet")).unlink(),
            BackupInvalidError,
            "table raw/meter_raw holds",
        ),
        (
            lambda d: edit(
                d, lambda m: m["archives"].update(gone={"kind": "raw", "fingerprint": "x"})
            ),
            BackupSpecMismatchError,
            "archive 'gone' of the backup is not declared",
        ),
        (
            lambda d: edit(d, lambda m: m["archives"]["tariff"].update(fingerprint="time_range|x")),
            BackupSpecMismatchError,
            "archive 'tariff' has another schema-relevant spec",
        ),
    ],
    ids=["missing", "not-json", "format", "path", "missing-file", "undeclared", "changed-spec"],
)
def test_a_restore_refuses_a_broken_or_foreign_backup_and_writes_nothing(
    tmp_path: Path, damage, error: type[BackupError], needle: str
) -> None:
    source = populated(tmp_path)
    backup(source, str(tmp_path / "backup"))
    damage(tmp_path / "backup")
    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    with pytest.raises(error, match=needle):
        restore(target, str(tmp_path / "backup"))
    assert not (tmp_path / "restored").exists()


def edit(backup_dir: Path, change) -> None:
    path = backup_dir / "manifest.json"
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_a_restore_refuses_specs_that_declare_an_archive_otherwise(tmp_path: Path) -> None:
    source = populated(tmp_path)
    backup(source, str(tmp_path / "backup"))
    other = parse_catalog(
        {
            "raw_archives": {"meter_raw": {"columns": {"kwh": {"type": "double"}}}},
            "time_range_archives": {"tariff": {"period": "1h", "columns": {"price": "double"}}},
            "rollups": {},
        }
    )
    target = Engine(other, Warehouse(str(tmp_path / "restored")))
    with pytest.raises(
        BackupSpecMismatchError, match="'meter_hourly' of the backup is not declared"
    ):
        restore(target, str(tmp_path / "backup"))
    assert not (tmp_path / "restored").exists()


def test_a_backup_of_a_table_written_after_the_versions_were_read_keeps_the_old_version(
    tmp_path: Path,
) -> None:
    """The copy stops at the version read, even though the table has moved on since."""
    source = populated(tmp_path)
    real = backups.consistent_versions
    frozen = real(source)
    raw_uri = source.raw.uri(source.catalog.raw["meter_raw"])

    def then_write(engine: Engine, attempts: int = 20) -> dict[str, int]:
        ingest(
            engine,
            "meter_raw",
            meter_rows().slice(0, 5).set_column(2, "kwh", pa.array([9.0] * 5)),
            tmp_path / "late.parquet",
        )
        return frozen

    backups.consistent_versions = then_write  # type: ignore[assignment]
    try:
        backup(source, str(tmp_path / "backup"))
    finally:
        backups.consistent_versions = real  # type: ignore[assignment]
    assert Path(commit_file(raw_uri, 3)).exists()
    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    restore(target, str(tmp_path / "backup"))
    restored = target.raw.table(CATALOG.raw["meter_raw"])
    assert restored is not None and restored.version() == 2
    assert 9.0 not in query_arrow(target, "meter_raw")["kwh"].to_pylist()


def _flip_a_byte(path: Path) -> None:
    """Change one byte of `path` in place: same size, other content."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def _one_file(backup_dir: Path, table: str, pattern: str) -> Path:
    return sorted((backup_dir / "tables" / table).rglob(pattern))[-1]


@pytest.mark.parametrize(
    ("table", "pattern"),
    [
        ("raw/meter_raw", "part-*.parquet"),  # a data file of a raw archive
        ("raw/meter_raw", "_delta_log/*.json"),  # a commit of its log
        ("_control/ledger", "*.parquet"),  # the ledger's data
        ("_control/archives", "_delta_log/*.json"),  # the archive states, restored last
    ],
)
def test_a_restore_refuses_a_file_altered_in_place_at_the_same_size_and_writes_nothing(
    tmp_path: Path, table: str, pattern: str
) -> None:
    source = populated(tmp_path)
    backup(source, str(tmp_path / "backup"))
    altered = _one_file(tmp_path / "backup", table, pattern)
    size = altered.stat().st_size
    _flip_a_byte(altered)
    assert altered.stat().st_size == size
    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    rel = altered.relative_to(tmp_path / "backup" / "tables" / table)
    with pytest.raises(BackupInvalidError) as info:
        restore(target, str(tmp_path / "backup"))
    message = str(info.value)
    assert f"file {rel} of table {table} does not match its checksum" in message, message
    assert "nothing was restored" in message
    assert not (tmp_path / "restored").exists()


def test_a_file_that_changes_between_verifying_and_copying_is_caught(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The bytes copied are checked too: a file altered after the check is named."""
    source = populated(tmp_path)
    manifest = backup(source, str(tmp_path / "backup"))
    altered = _one_file(tmp_path / "backup", "raw/tariff", "part-*.parquet")
    _flip_a_byte(altered)
    recorded = {t.path: t.sha256 for t in manifest.tables}

    def as_recorded(fs: object, root: str, paths: list[str]) -> dict[str, str]:
        table = root.split("/tables/", 1)[1]
        return {p: recorded[table][p] for p in paths}  # the check passes: the file changed later

    monkeypatch.setattr(backups, "sha256_of_files", as_recorded)
    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    rel = altered.relative_to(tmp_path / "backup" / "tables" / "raw" / "tariff")
    with pytest.raises(BackupInvalidError, match=f"file {rel} of table raw/tariff does not"):
        restore(target, str(tmp_path / "backup"))
    # Nothing activates the half-restored warehouse: the archive states' log comes last.
    assert not (tmp_path / "restored" / "_control" / "archives" / "_delta_log").exists()


@pytest.mark.parametrize(
    ("damage", "needle"),
    [
        (
            lambda d: edit(d, lambda m: m.update(format_version=1)),
            "made by an older release: it records no checksums",
        ),
        (
            lambda d: edit(d, lambda m: m["tables"][0].pop("sha256")),
            "missing or malformed field",
        ),
        (
            lambda d: edit(d, lambda m: m["tables"][0]["sha256"].popitem()),
            "file(s) but",
        ),
        (
            lambda d: edit(
                d,
                lambda m: m["tables"][0]["sha256"].update(
                    dict.fromkeys(m["tables"][0]["sha256"], "x")
                ),
            ),
            "has no SHA-256",
        ),
        (
            lambda d: edit(d, lambda m: m["tables"][0].update(files="1")),
            "missing or malformed field",
        ),
        (
            lambda d: _one_file(d, "raw/meter_raw", "part-*.parquet").rename(
                _one_file(d, "raw/meter_raw", "part-*.parquet").with_name("part-x.parquet")
            ),
            "a file its manifest does not list",
        ),
    ],
    ids=[
        "older-release",
        "no-checksums",
        "checksum-missing",
        "not-a-checksum",
        "text-count",
        "renamed",
    ],
)
def test_a_restore_refuses_a_manifest_that_cannot_vouch_for_its_files(
    tmp_path: Path, damage, needle: str
) -> None:
    source = populated(tmp_path)
    backup(source, str(tmp_path / "backup"))
    damage(tmp_path / "backup")
    target = Engine(CATALOG, Warehouse(str(tmp_path / "restored")))
    with pytest.raises(BackupInvalidError) as info:
        restore(target, str(tmp_path / "backup"))
    assert needle in str(info.value), str(info.value)
    assert not (tmp_path / "restored").exists()
