"""Copying a Delta table at one version: the copy reads exactly like the original at that
version (rows and change data feed), and carries nothing of later commits."""

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from deltalake import DeltaTable, write_deltalake

from rollup_assets.model.errors import BackupError
from rollup_assets.resources.delta_copy import copy_table, files_at, first_entry, table_paths

CONFIG = {"delta.enableChangeDataFeed": "true", "delta.checkpointInterval": "3"}


def build(path: Path, commits: int) -> None:
    """A day-partitioned CDF table: one create, then `commits` merges of one changing row."""
    write_deltalake(
        str(path),
        pa.table({"k": ["a", "b"], "day": ["2024-01-01", "2024-01-02"], "v": [1.0, 2.0]}),
        partition_by=["day"],
        configuration=CONFIG,
    )
    for i in range(commits):
        source = pa.table({"k": ["a", f"n{i}"], "day": ["2024-01-01", "2024-01-03"], "v": [i, i]})
        (
            DeltaTable(str(path))
            .merge(
                source.cast(
                    pa.schema([("k", pa.string()), ("day", pa.string()), ("v", pa.float64())])
                ),
                predicate="t.k = s.k AND t.day = s.day",
                source_alias="s",
                target_alias="t",
            )
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


def rows(path: Path, version: int | None = None) -> list[dict]:
    t = DeltaTable(str(path), version=version)
    return sorted(pa.table(t.to_pyarrow_table()).to_pylist(), key=lambda r: (r["day"], r["k"]))


def changes(path: Path, start: int, end: int) -> list[tuple]:
    cdf = pa.table(DeltaTable(str(path)).load_cdf(starting_version=start, ending_version=end))
    return sorted(
        (r["k"], r["v"], str(r["_change_type"]), r["_commit_version"]) for r in cdf.to_pylist()
    )


def test_a_copy_at_an_old_version_is_that_version_and_nothing_later(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, 6)  # checkpoints at 2 and 5; _last_checkpoint points at 5
    assert DeltaTable(str(src)).version() == 6
    assert '"version":5' in (src / "_delta_log" / "_last_checkpoint").read_text()
    local = pafs.LocalFileSystem()

    copied = copy_table(str(src), 3, (local, str(dst)), history=True)

    copy = DeltaTable(str(dst))
    assert copy.version() == 3
    assert rows(dst) == rows(src, 3)
    assert changes(dst, 1, 3) == changes(src, 1, 3) != []
    assert copy.metadata().id == DeltaTable(str(src)).metadata().id
    log = sorted(p.name for p in (dst / "_delta_log").iterdir())
    assert "_last_checkpoint" not in log  # it points at 5, past the copied version
    assert max(int(n[:20]) for n in log) == 3
    assert copied.files == sum(1 for p in dst.rglob("*") if p.is_file())


def test_a_copy_at_the_latest_version_keeps_every_change_and_the_checkpoint_hint(
    tmp_path: Path,
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, 6)
    copy_table(str(src), 6, (pafs.LocalFileSystem(), str(dst)), history=True)
    assert rows(dst) == rows(src)
    assert changes(dst, 0, 6) == changes(src, 0, 6)
    assert (dst / "_delta_log" / "_last_checkpoint").read_bytes() == (
        src / "_delta_log" / "_last_checkpoint"
    ).read_bytes()


def test_without_history_only_the_live_files_are_copied(tmp_path: Path) -> None:
    src = tmp_path / "src"
    build(src, 4)
    files = files_at(str(src), 4)
    root = str(src) + "/"
    assert set(files.data) == {u.removeprefix(root) for u in DeltaTable(str(src)).file_uris()}
    assert files.history == []
    assert not any(f.startswith("_change_data") for f in files.data)
    with_history = files_at(str(src), 4, history=True)
    assert any(f.startswith("_change_data/") for f in with_history.history)


def test_a_missing_live_file_fails_the_copy(tmp_path: Path) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, 1)
    victim = next((src / "day=2024-01-02").glob("*.parquet"))  # never rewritten: live
    victim.unlink()
    with pytest.raises(BackupError, match="missing"):
        copy_table(str(src), 1, (pafs.LocalFileSystem(), str(dst)))


def test_tables_and_emptiness_of_a_root(tmp_path: Path) -> None:
    local = pafs.LocalFileSystem()
    assert first_entry(local, str(tmp_path / "nope")) is None
    build(tmp_path / "raw" / "a", 0)
    build(tmp_path / "_control" / "ledger", 0)
    (tmp_path / "rollups" / "not_a_table").mkdir(parents=True)
    assert table_paths(local, str(tmp_path)) == ["_control/ledger", "raw/a"]
    assert first_entry(local, str(tmp_path)) == "_control"
