"""Dirty cells: the cells of a first level a source change dirties, and their lift up the chain
(the one rule change detection, chain propagation and the impact preview follow)."""

from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.cells import Cells
from rollup_assets.model.dirty import dirty_before, dirty_cells, lifted_cells
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window

CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")
DAILY = CATALOG.rollup("energy_daily")
H = timedelta(hours=1)
US = timedelta(microseconds=1)
T0 = datetime(2025, 3, 3, tzinfo=UTC)  # a Monday; Vienna is UTC+1, its day starts at 23:00 UTC
CONSUMED = T0 + 10 * H


def hour(i: int) -> Window:
    return Window(T0 + i * H, T0 + (i + 1) * H)


@pytest.mark.parametrize(
    ("state", "before"),
    [
        (None, None),
        (ArchiveState("energy_hourly"), None),  # created: consumes nothing
        (ArchiveState("energy_hourly", status=ArchiveStatus.ACTIVATED), None),
        (ArchiveState("energy_hourly", status=ArchiveStatus.ACTIVATED, watermark=T0), T0),
        # A forward claim counts: a write racing the forward run is not lost.
        (
            ArchiveState(
                "energy_hourly", status=ArchiveStatus.ACTIVATED, watermark=T0, claimed_until=T0 + H
            ),
            T0 + H,
        ),
        (ArchiveState("energy_hourly", status=ArchiveStatus.DISABLED, watermark=T0), T0),
        (ArchiveState("energy_hourly", status=ArchiveStatus.DELETED, watermark=T0), None),
    ],
)
def test_a_change_dirties_what_a_rollup_consumed(
    state: ArchiveState | None, before: datetime | None
) -> None:
    assert dirty_before(state) == before


@pytest.mark.parametrize(
    ("rows", "cells"),
    [
        ([], Cells()),
        # Before the watermark: the bucket of the row's time; at or after it: the forward lane's.
        ([(CONSUMED - US, "a")], Cells(((hour(9), frozenset({"a"})),))),
        ([(CONSUMED, "a"), (CONSUMED + H, "b")], Cells()),
        # Per bucket the entities named, never the cross product of buckets and entities.
        (
            [(T0 + 3 * H, "a"), (T0 + 7 * H + 59 * timedelta(minutes=1), "b"), (T0 + 3 * H, "c")],
            Cells(((hour(3), frozenset({"a", "c"})), (hour(7), frozenset({"b"})))),
        ),
        # An unnamed entity makes the bucket every entity's.
        ([(T0, "a"), (T0 + US, None)], Cells(((hour(0), None),))),
    ],
)
def test_changed_rows_dirty_the_cell_of_their_bucket_before_the_watermark(
    rows: list[tuple[datetime, str | None]], cells: Cells
) -> None:
    assert dirty_cells(HOURLY, CONSUMED, rows=rows) == cells


def test_changed_spans_dirty_every_bucket_they_overlap_up_to_the_watermark() -> None:
    # Both instants inclusive: a span ending on a boundary's last instant stays in its bucket.
    spans = [
        (T0 + 30 * timedelta(minutes=1), T0 + 2 * H - US, "a"),
        (T0 + 9 * H, T0 + 30 * H, None),
    ]
    assert dirty_cells(HOURLY, CONSUMED, spans=spans) == Cells(
        ((hour(0), frozenset({"a"})), (hour(1), frozenset({"a"})), (hour(9), None))
    )
    assert dirty_cells(HOURLY, CONSUMED, spans=[(CONSUMED, CONSUMED + H, "a")]) == Cells()


def test_past_the_limit_a_bucket_is_dirty_for_every_entity_and_without_one_exact() -> None:
    rows = [(T0, e) for e in "abc"]
    assert dirty_cells(HOURLY, CONSUMED, rows=rows, limit=2) == Cells(((hour(0), None),))
    exact = dirty_cells(HOURLY, CONSUMED, rows=rows * 40, limit=None)
    assert exact == Cells(((hour(0), frozenset("abc")),))


def test_nothing_is_dirty_where_retention_removed_the_rows_or_before_the_first_bucket() -> None:
    rows = [(T0 + i * H, "a") for i in range(4)]
    removed = [Window(T0 + H, T0 + 2 * H + US)]  # reaches into hour 2
    assert dirty_cells(HOURLY, CONSUMED, rows=rows, removed=removed) == Cells(
        ((hour(0), frozenset({"a"})), (hour(3), frozenset({"a"})))
    )
    first = first_bucket_start(HOURLY)
    early = dirty_cells(HOURLY, CONSUMED, rows=[(first - US, "a"), (first, "b")])
    assert early == Cells(((Window(first, first + H), frozenset({"b"})),))


def test_a_dirty_cell_dirties_the_cell_containing_it_one_level_up() -> None:
    vienna_day = Window(T0 - H, T0 + 23 * H)  # March 3 in Vienna
    next_day = Window(vienna_day.end, vienna_day.end + 24 * H)
    below = Cells(
        (
            (hour(0), frozenset({"a"})),
            (hour(5), frozenset({"b"})),
            (hour(23), frozenset({"c"})),
            (hour(46), None),
        )
    )
    assert lifted_cells(DAILY, below, next_day.end) == Cells(
        ((vienna_day, frozenset({"a", "b"})), (next_day, None))
    )
    # A bucket above the level has not consumed yet is the forward lane's.
    assert lifted_cells(DAILY, below, next_day.start) == Cells(
        ((vienna_day, frozenset({"a", "b"})),)
    )
    # Past the limit every entity; without one the exact cells.
    assert lifted_cells(DAILY, below, next_day.start, limit=1) == Cells(((vienna_day, None),))
    many = Cells(tuple((hour(i), frozenset({f"m{i}"})) for i in range(20)))
    [(day, scope)] = lifted_cells(DAILY, many, next_day.start, limit=None)
    assert day == vienna_day and scope == frozenset(f"m{i}" for i in range(20))
