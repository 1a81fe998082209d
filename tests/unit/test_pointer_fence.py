"""The pointer table's fence is a compare-and-set token: an action that read it commits only
while it is unchanged. A rollup deleted and created again has a new pointer table, which must
never show an action still under way the value it read from the deleted one."""

import shutil
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from rollup_assets.model.errors import FenceMovedError
from rollup_assets.resources.genmap import GENMAP_SCHEMA, read_fence, write_pointer_table

T0 = datetime(2025, 1, 1, tzinfo=UTC)


def pointer(generation: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {
                "bucket_start": T0,
                "bucket_end": T0.replace(hour=1),
                "entity_id": None,
                "generation": generation,
                "job_id": f"job-{generation}",
                "run_id": "r",
                "flipped_at": T0,
                "delta": False,
            }
        ],
        schema=GENMAP_SCHEMA,
    )


def flip(uri: str, generation: int, **kw) -> int:
    return write_pointer_table(uri, lambda _: pointer(generation), metadata={}, **kw)


def test_a_moved_fence_fails_the_commit_of_whoever_read_it_before(tmp_path):
    uri = str(tmp_path / "genmap")
    flip(uri, 1)
    read = read_fence(uri)
    flip(uri, 2, move=True)  # a rewind, rollback, retention or disable
    with pytest.raises(FenceMovedError, match="fence moved"):
        flip(uri, 3, expect=read)
    flip(uri, 3, expect=read_fence(uri))


@pytest.mark.parametrize("moves", [0, 1, 2])
def test_a_table_created_again_never_shows_the_fence_of_the_deleted_one(tmp_path, moves):
    """The same number of fence moves on both tables: a counter from zero would give the new
    table the very value an action read from the old one, and its stale flip would commit."""
    uri = str(tmp_path / "genmap")
    flip(uri, 1)
    for _ in range(moves):
        flip(uri, 1, move=True)
    stale = read_fence(uri)  # a recompute under way reads the fence, then its rollup is deleted
    shutil.rmtree(uri)
    flip(uri, 1)  # created again, and filled
    for _ in range(moves):
        flip(uri, 1, move=True)
    assert read_fence(uri) != stale
    with pytest.raises(FenceMovedError):
        flip(uri, 9, expect=stale)
