"""Every column's statistics are read, not Delta's default first 32: a rollup's row table keeps
its bookkeeping columns (`generation`) after its companions, and files are pruned by them."""

from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable, write_deltalake

from rollup_assets.resources.delta_commits import CommitPlan, commit
from rollup_assets.resources.delta_files import add_action, write_file
from rollup_assets.resources.delta_tables import INDEXED_COLUMNS, file_actions

# 40 value columns, then the one files are pruned by.
SCHEMA = pa.schema(
    [*(pa.field(f"c{i:02d}", pa.float64()) for i in range(40)), ("generation", pa.int64())]
)


def rows(generation: int) -> pa.Table:
    return pa.table(
        {**{f"c{i:02d}": [float(i)] for i in range(40)}, "generation": [generation]}, schema=SCHEMA
    )


def add_file(uri: str, generation: int) -> None:
    fs, root = pafs.LocalFileSystem(), uri
    entry = write_file(fs, root, "", rows(generation))
    commit(uri, lambda _: CommitPlan(adds=[add_action(entry)]), schema=SCHEMA)


def test_a_table_created_here_reads_the_statistics_of_its_41st_column(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    add_file(uri, 3)
    add_file(uri, 5)
    table = DeltaTable(uri)
    assert table.metadata().configuration[INDEXED_COLUMNS] == "-1"
    assert sorted(f["min.generation"] for f in file_actions(table)) == [3, 5]


def test_a_table_created_before_reads_them_from_its_next_commit(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, rows(3))  # Delta's defaults: statistics of the first 32 columns
    assert [f.get("min.generation") for f in file_actions(DeltaTable(uri))] == [None]
    add_file(uri, 5)
    table = DeltaTable(uri)
    assert table.metadata().configuration[INDEXED_COLUMNS] == "-1"
    # The new file's statistics hold every column; the old file's were written by Delta's own
    # writer, which kept 32, and stay unknown (such a file is read, never skipped wrongly).
    assert sorted(f.get("min.generation") or -1 for f in file_actions(table)) == [-1, 5]
    assert [c.get("operation") for c in table.history()][:2] == ["WRITE", "SET TBLPROPERTIES"]
