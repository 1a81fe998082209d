"""Which files a lagging read opens for the differences flipped since a publish
(`rollup_differences._may_hold`), and which surface files it decodes the fold state of
(`surface_reads._Holds`): told from file statistics alone, never a file that may hold one."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa

from rollup_assets.compute.arrow_types import TS
from rollup_assets.resources.rollup_differences import AFTER, UPTO, _may_hold
from rollup_assets.services.surface_reads import _Holds

DAY = datetime(2025, 3, 1, tzinfo=UTC)


def cells(rows: list[tuple[int, str, int, int]]) -> pa.Table:
    """(day offset, entity, after, upto) per cell."""
    return pa.table(
        {
            "bucket_start": pa.array([DAY + timedelta(days=d) for d, *_ in rows], TS),
            "entity_id": pa.array([e for _, e, _, _ in rows], pa.string()),
            AFTER: pa.array([a for *_, a, _ in rows], pa.int64()),
            UPTO: pa.array([u for *_, u in rows], pa.int64()),
        }
    )


def stats(first: int, last: int, g_lo: int | None, g_hi: int | None, delta: bool | None) -> dict:
    return {
        "path": f"f-{first}-{last}-{g_lo}-{g_hi}-{delta}",
        "min.bucket_start": DAY + timedelta(days=first),
        "max.bucket_start": DAY + timedelta(days=last),
        "min.generation": g_lo,
        "max.generation": g_hi,
        "max.delta": delta,
    }


def test_difference_files_are_kept_only_when_their_statistics_may_hold_a_cells_range() -> None:
    wanted = cells([(3, "m-1", 5, 9), (10, "m-2", 1, 4)])
    files = [
        stats(0, 5, 6, 6, True),  # day 3, generation 6 in (5, 9]: kept
        stats(0, 5, 2, 5, True),  # day 3's generations all at most 5: skipped
        stats(0, 5, 10, 12, True),  # past day 3's pointer: skipped
        stats(6, 9, 6, 6, True),  # no cell's day: skipped
        stats(10, 12, 4, 4, True),  # day 10, generation 4 in (1, 4]: kept
        stats(0, 20, 6, 6, False),  # base rows only: skipped
        stats(0, 20, None, None, None),  # no statistics: kept
    ]
    kept = [f["path"] for f in _may_hold(files, wanted)]
    assert kept == [files[0]["path"], files[4]["path"], files[6]["path"]]


def test_surface_files_hold_a_cell_when_both_its_day_and_entity_fall_in_their_ranges() -> None:
    holds = _Holds(
        cells([(3, "m-5", 0, 1), (8, "m-2", 0, 1)]).select(["bucket_start", "entity_id"])
    )

    def f(first: int, last: int, low: str | None, high: str | None) -> dict:
        return {
            "min.bucket_start": DAY + timedelta(days=first),
            "max.bucket_start": DAY + timedelta(days=last),
            "min.entity_id": low,
            "max.entity_id": high,
        }

    assert holds(f(0, 5, "m-4", "m-6"))
    assert not holds(f(0, 5, "m-6", "m-9"))  # day 3, but another entity range
    assert not holds(f(4, 7, "m-0", "m-9"))  # no cell's day
    assert holds(f(8, 8, "m-1", "m-3"))
    assert holds(f(0, 5, None, None))  # entity range unknown
    assert holds({})  # no statistics at all
    assert not _Holds(None)(f(0, 5, "m-4", "m-6"))
