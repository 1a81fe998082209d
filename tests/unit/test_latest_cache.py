"""Reads served from memory must never be stale: a control table or pointer table read again
after any commit (from this object or another writer) or after the table was re-created at the
same location returns exactly what a fresh read would."""

import shutil
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from deltalake import write_deltalake

import rollup_assets.resources.latest_versions as latest_versions
from rollup_assets.resources.control_tables import ControlTable
from rollup_assets.resources.genmap import GENMAP_SCHEMA, read_pointers, write_pointer_table
from rollup_assets.resources.latest_versions import LatestCache, LatestVersions, committed_after

SCHEMA = pa.schema([("name", pa.string()), ("n", pa.int64())])


def rows(table: pa.Table) -> list[tuple[str, int]]:
    return sorted(zip(table["name"].to_pylist(), table["n"].to_pylist(), strict=True))


def test_unchanged_table_is_read_once_and_a_commit_by_another_writer_is_seen(tmp_path):
    uri = str(tmp_path / "control")
    reader, writer = ControlTable(uri, SCHEMA), ControlTable(uri, SCHEMA)
    assert reader.read().num_rows == 0
    writer.append([{"name": "a", "n": 1}])
    first = reader.read()
    assert rows(first) == [("a", 1)]
    assert reader.read() is first  # unchanged: served from memory
    writer.append([{"name": "b", "n": 2}])
    assert rows(reader.read()) == [("a", 1), ("b", 2)]


def test_a_table_recreated_at_the_same_location_is_read_afresh(tmp_path):
    uri = str(tmp_path / "control")
    table = ControlTable(uri, SCHEMA)
    for i in range(3):
        table.append([{"name": f"old{i}", "n": i}])
    assert len(rows(table.read())) == 3
    shutil.rmtree(uri)
    # Fewer commits than before: the cached version's successor does not exist either.
    write_deltalake(uri, pa.table({"name": ["new"], "n": [7]}, schema=SCHEMA))
    assert rows(table.read()) == [("new", 7)]


def test_a_deleted_table_reads_empty(tmp_path):
    uri = str(tmp_path / "control")
    table = ControlTable(uri, SCHEMA)
    table.append([{"name": "a", "n": 1}])
    assert table.read().num_rows == 1
    shutil.rmtree(uri)
    assert table.read().num_rows == 0


def test_pointer_reads_follow_every_flip(tmp_path):
    uri = str(tmp_path / "genmap")
    assert read_pointers(uri) == (GENMAP_SCHEMA.empty_table(), None)
    t0 = datetime(2025, 1, 1, tzinfo=UTC)
    for generation in (1, 2, 3):
        row = {
            "bucket_start": t0,
            "bucket_end": t0,
            "entity_id": None,
            "generation": generation,
            "job_id": "j",
            "run_id": "r",
            "flipped_at": t0,
        }
        write_pointer_table(
            uri, lambda cur, row=row: pa.Table.from_pylist([row], GENMAP_SCHEMA), metadata={}
        )
        pointers, version = read_pointers(uri)
        assert pointers["generation"].to_pylist() == [generation]
        assert version is not None and not committed_after(uri, version)
    assert committed_after(uri, version - 1)


def test_derived_values_are_recomputed_only_when_the_table_moves(tmp_path):
    uri = str(tmp_path / "t")
    calls = []

    def derive(table):
        calls.append(table.version())
        return table.version()

    cache = LatestCache(derive)
    assert cache.get(uri) is None
    write_deltalake(uri, pa.table({"name": ["a"], "n": [1]}, schema=SCHEMA))
    assert cache.get(uri) == (0, 0)
    assert cache.get(uri) == (0, 0)
    write_deltalake(uri, pa.table({"name": ["b"], "n": [2]}, schema=SCHEMA), mode="append")
    assert cache.get(uri) == (1, 1)
    assert calls == [0, 1]


def test_a_table_dropped_while_it_is_read_is_not_served_from_memory(tmp_path):
    uri = str(tmp_path / "t")
    write_deltalake(uri, pa.table({"name": ["a"], "n": [1]}, schema=SCHEMA))

    def derive(table):
        value = table.version()
        shutil.rmtree(uri)  # dropped after the read, before its commit file is stamped
        return value

    cache = LatestCache(derive)
    assert cache.get(uri) == (0, 0)
    assert cache.get(uri) is None


def test_latest_versions_follow_commits_without_opening_the_table(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    versions = LatestVersions()
    assert versions.get(uri) is None
    write_deltalake(uri, pa.table({"name": ["a"], "n": [1]}, schema=SCHEMA))
    assert versions.get(uri) == 0
    opened = []
    real = latest_versions.open_table
    monkeypatch.setattr(
        latest_versions, "open_table", lambda *a, **k: opened.append(a) or real(*a, **k)
    )
    for n in (2, 3):
        write_deltalake(uri, pa.table({"name": ["b"], "n": [n]}, schema=SCHEMA), mode="append")
    assert versions.get(uri) == 2 and versions.get(uri) == 2
    assert opened == []  # found from the commit files alone
    # Re-created with fewer commits than before, then dropped: opened afresh, then no table.
    shutil.rmtree(uri)
    write_deltalake(uri, pa.table({"name": ["new"], "n": [7]}, schema=SCHEMA))
    assert versions.get(uri) == 0 and len(opened) == 1
    shutil.rmtree(uri)
    assert versions.get(uri) is None


@pytest.mark.parametrize("version", [None, 0])
def test_committed_after_on_a_missing_table(tmp_path, version):
    assert not committed_after(str(tmp_path / "none"), version)


def test_appends_extend_the_cached_rows_and_anything_else_reads_afresh(tmp_path):
    uri = str(tmp_path / "t")
    derived, extended = [], []

    def derive(table):
        derived.append(table.version())
        return pa.table(table.to_pyarrow_table())

    def extend(value, added):
        extended.append(added.num_rows)
        return pa.concat_tables([value, added.select(value.column_names)])

    cache = LatestCache(derive, extend)
    write_deltalake(uri, pa.table({"name": ["a"], "n": [1]}, schema=SCHEMA))
    assert rows(cache.get(uri)[0]) == [("a", 1)]
    # Two appends (one of two rows) since the cached version: only their files are read.
    write_deltalake(uri, pa.table({"name": ["b"], "n": [2]}, schema=SCHEMA), mode="append")
    write_deltalake(uri, pa.table({"name": ["c", "d"], "n": [3, 4]}, schema=SCHEMA), mode="append")
    value, version = cache.get(uri)
    assert version == 2 and rows(value) == [("a", 1), ("b", 2), ("c", 3), ("d", 4)]
    assert derived == [0] and extended == [3]
    # A commit that removes files (an overwrite) is read whole, and equals a fresh read.
    write_deltalake(uri, pa.table({"name": ["e"], "n": [5]}, schema=SCHEMA), mode="overwrite")
    value, version = cache.get(uri)
    assert version == 3 and rows(value) == [("e", 5)]
    assert derived == [0, 3]
    # So is a schema change, even one that only adds a column.
    wide = pa.schema([*SCHEMA, ("extra", pa.string())])
    write_deltalake(
        uri,
        pa.table({"name": ["f"], "n": [6], "extra": ["x"]}, schema=wide),
        mode="append",
        schema_mode="merge",
    )
    value, version = cache.get(uri)
    assert version == 4 and derived == [0, 3, 4]
    assert sorted(value["name"].to_pylist()) == ["e", "f"]


def test_a_control_table_read_after_appends_equals_a_fresh_read(tmp_path):
    uri = str(tmp_path / "control")
    reader, writer = ControlTable(uri, SCHEMA), ControlTable(uri, SCHEMA)
    writer.append([{"name": "a", "n": 1}])
    assert rows(reader.read()) == [("a", 1)]
    for i in range(12):  # past a checkpoint (every 10 commits)
        writer.append([{"name": f"x{i}", "n": i}, {"name": f"y{i}", "n": -i}])
    assert rows(reader.read()) == rows(ControlTable(uri, SCHEMA).read())
    assert reader.read().num_rows == 25


def test_a_version_is_read_once_and_afresh_after_the_table_was_recreated(tmp_path, monkeypatch):
    uri = str(tmp_path / "table")
    for i in range(2):
        write_deltalake(
            uri, pa.table({"name": [f"old{i}"], "n": [i]}, schema=SCHEMA), mode="append"
        )
    opened: list[int | None] = []
    real = latest_versions.open_table

    def counted(uri, options=None, version=None):  # type: ignore[no-untyped-def]
        opened.append(version)
        return real(uri, options, version)

    monkeypatch.setattr(latest_versions, "open_table", counted)
    cache = latest_versions.VersionCache(lambda t: pa.table(t.to_pyarrow_table()))
    first = cache.get(uri, 0)
    assert first is not None and rows(first) == [("old0", 0)]
    assert cache.get(uri, 0) is first and opened == [0]  # served from memory
    assert rows(cache.get(uri, 1)) == [("old0", 0), ("old1", 1)]  # type: ignore[arg-type]
    shutil.rmtree(uri)
    write_deltalake(uri, pa.table({"name": ["new"], "n": [7]}, schema=SCHEMA))
    # Version 0 of the new table: its commit file is not the one the cached rows came from.
    assert rows(cache.get(uri, 0)) == [("new", 7)]  # type: ignore[arg-type]
    assert opened == [0, 1, 0]
    shutil.rmtree(uri)
    assert cache.get(uri, 0) is None
