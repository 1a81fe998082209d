"""The surface's file layout as pure functions: cutting a partition's rows into files of whole
entities within the cap, which file takes a row of an entity, which files a change reads, the
merge back into query order, and which small neighbours maintenance merges."""

import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.cells import Cells
from rollup_assets.model.windows import Window
from rollup_assets.services.surface_layout import (
    EntityRange,
    claims,
    compaction_groups,
    files_to_read,
    in_entity_order,
    in_query_order,
    split_by_entity,
)

T0 = datetime(2025, 1, 1, tzinfo=UTC)
H = timedelta(hours=1)


def rows(entities: dict[str, int]) -> pa.Table:
    """`n` hourly rows from T0 for each entity, in a scrambled order."""
    pairs = [(e, T0 + i * H) for e, n in entities.items() for i in range(n)]
    order = np.random.default_rng(3).permutation(len(pairs))
    pairs = [pairs[i] for i in order]
    return pa.table(
        {
            "entity_id": pa.array([e for e, _ in pairs]),
            "bucket_start": pa.array([t for _, t in pairs], TS),
        }
    )


def entity_sets(pieces: list[pa.Table]) -> list[set[str]]:
    return [set(p["entity_id"].to_pylist()) for p in pieces]


def file(low: str | None, high: str | None, n: int = 10, first: int = 0, hours: int = 24) -> dict:
    """A file action row (as `file_actions` gives it) with entity and bucket statistics."""
    return {
        "path": f"f-{low}-{high}",
        "num_records": n,
        "min.entity_id": low,
        "max.entity_id": high,
        "min.bucket_start": T0 + first * H,
        "max.bucket_start": T0 + (first + hours - 1) * H,
    }


@pytest.mark.parametrize(
    ("sizes", "cap", "files"),
    [
        ({"a": 3, "b": 3}, 8, 1),  # under the cap: one file
        ({"a": 4, "b": 4, "c": 4, "d": 4}, 8, 2),  # 16 rows: two files of two entities
        ({"a": 5, "b": 5, "c": 5}, 8, 3),  # 15 rows: cut between entities, never inside one
        ({"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1}, 2, 4),
        ({"big": 20, "a": 1}, 8, 2),  # one entity over the cap keeps a file of its own
    ],
)
def test_a_partition_is_cut_into_files_of_whole_entities_within_the_cap(
    sizes: dict[str, int], cap: int, files: int
) -> None:
    table = rows(sizes)
    pieces = split_by_entity(table, cap)
    assert len(pieces) == files
    assert sum(p.num_rows for p in pieces) == table.num_rows
    sets = entity_sets(pieces)
    assert sum(len(s) for s in sets) == len(sizes)  # no entity in two files
    for p, s in zip(pieces, sets, strict=True):
        assert p.num_rows <= cap or len(s) == 1
    # Entity ranges in order and disjoint; inside a file, rows by bucket start, then entity.
    assert all(max(a) < min(b) for a, b in itertools.pairwise(sets))
    for p in pieces:
        keys = list(zip(p["bucket_start"].to_pylist(), p["entity_id"].to_pylist(), strict=True))
        assert keys == sorted(keys)


def test_pieces_are_about_equal_so_a_split_file_has_room_to_grow() -> None:
    pieces = split_by_entity(rows({f"m{i:02d}": 3 for i in range(30)}), 60)  # 90 rows, cap 60
    assert [p.num_rows for p in pieces] == [45, 45]


def test_each_entity_is_taken_by_the_file_whose_range_it_falls_in_or_extends() -> None:
    ordered = in_entity_order([file("m", "p"), file("c", "f"), file("t", "x")])
    assert [EntityRange.of(f).low for f in ordered] == ["c", "m", "t"]
    taken = claims(ordered, pa.array(["a", "c", "e", "g", "m", "q", "t", "z"]))
    assert taken.tolist() == [0, 0, 0, 0, 1, 1, 2, 2]
    # No file of known range: new files take them.
    assert claims([file(None, None)], pa.array(["a"])).tolist() == [-1]


def test_a_change_reads_only_the_files_that_may_hold_its_cells() -> None:
    ordered = in_entity_order([file("a", "f"), file("g", "m"), file("n", "z", first=24)])
    day1 = Window(T0 + 2 * H, T0 + 3 * H)
    day2 = Window(T0 + 30 * H, T0 + 31 * H)
    none = np.array([], dtype=np.int64)
    # One cell: the file whose entity range holds it (and whose buckets reach it).
    assert files_to_read(ordered, Cells(((day1, frozenset({"h"})),)), none) == [1]
    assert files_to_read(ordered, Cells(((day2, frozenset({"h"})),)), none) == []
    assert files_to_read(ordered, Cells(((day2, frozenset({"b", "p"})),)), none) == [2]
    # A whole bucket (a global pointer, a forward commit): every file holding the bucket.
    assert files_to_read(ordered, Cells(((day1, None),)), none) == [0, 1]
    # A file that takes a new row is read too; a file of unknown range always may hold a cell.
    assert files_to_read(ordered, Cells(()), np.array([2, -1])) == [2]
    unknown = [*ordered, file(None, None)]
    assert files_to_read(unknown, Cells(((day1, frozenset({"h"})),)), none) == [1, 3]


def test_files_in_entity_order_merge_into_query_order() -> None:
    table = rows({f"m{i}": 5 for i in range(9)})
    pieces = split_by_entity(table, 12)
    assert len(pieces) > 2
    merged = in_query_order(pieces)
    assert merged.equals(table.sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")]))
    # Slices of the files' rows, not copies: a run per bucket start and file.
    buckets = len(set(table["bucket_start"].to_pylist()))
    assert {c.num_chunks for c in merged.columns} <= set(range(1, buckets * len(pieces) + 1))
    assert (
        merged["entity_id"].chunks[0].buffers()[1] == pieces[0]["entity_id"].chunks[0].buffers()[1]
    )
    # A file with no rows in the read's range takes no part.
    empty = pieces[1].slice(0, 0)
    assert in_query_order([pieces[0], empty, *pieces[2:]]).equals(
        in_query_order([pieces[0], *pieces[2:]])
    )
    assert in_query_order([empty, empty]).num_rows == 0
    # A file not ordered by bucket start (another writer's) is merged by a stable sort: every
    # row once, by bucket start.
    backwards = pieces[0].take(pa.array(range(pieces[0].num_rows - 1, -1, -1)))
    merged = in_query_order([backwards, *pieces[1:]])
    assert sorted(merged.to_pylist(), key=str) == sorted(table.to_pylist(), key=str)
    starts = merged["bucket_start"].to_pylist()
    assert starts == sorted(starts)


def test_small_neighbours_are_merged_up_to_half_the_cap() -> None:
    ordered = in_entity_order(
        [
            file("a", "b", n=3),
            file("c", "d", n=3),
            file("e", "f", n=9),  # too big to join its neighbours
            file("g", "h", n=2),
            file("i", "j", n=2),
            file("k", "l", n=2),
        ]
    )
    groups = compaction_groups(ordered, limit=6)
    assert [[f["path"] for f in g] for g in groups] == [
        ["f-a-b", "f-c-d"],
        ["f-g-h", "f-i-j", "f-k-l"],
    ]
    assert compaction_groups([file(None, None, n=1), file(None, None, n=1)], limit=6) == []
