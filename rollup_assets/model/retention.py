"""Retention: which whole UTC days of a raw or time-range archive go, which buckets of a rollup
go, and what that forbids.

A raw table is partitioned by the UTC day of its time column. Retention drops whole days: a day
goes when every instant of it is older than `now - retention` (the day ending exactly at that
instant goes too; the day holding it stays), and only once every first-level rollup reading the
archive has aggregated it (its watermark is past the day's end) and has no pending or running
work in it. The rollups keep what they aggregated from the dropped rows: they become the only
record, so a first-level recompute that would need those rows is refused, while the levels above
still recompute from the level below.

A rollup drops whole buckets: a bucket goes when it ends at or before `now - retention`, and
only once every rollup reading it (the levels directly above) has aggregated it (its watermark
is at or past the bucket's end) and neither the rollup nor a reader has pending or running work
in it. The levels above keep their values; a recompute that would read the dropped buckets is
refused, and a correction skips them at that level while the levels above still take it.

Pure Python: every instant is an aware UTC `datetime`.
"""

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, time, timedelta

from rollup_assets.model.windows import Window, merge_windows

DAY = timedelta(days=1)
# The start of time for "everything before a day": the earliest instant a raw row may hold.
BEGINNING = datetime(1, 1, 1, tzinfo=UTC)


def utc_midnight(t: datetime) -> datetime:
    """The UTC midnight at or before instant `t`."""
    return datetime.combine(t.astimezone(UTC).date(), time(0), tzinfo=UTC)


def retention_horizon(now: datetime, retention: timedelta) -> datetime:
    """The UTC midnight before which every day is older than `now - retention` (and goes)."""
    return utc_midnight(now - retention)


def retention_cut(now: datetime, retention: timedelta, holds: Iterable[datetime]) -> datetime:
    """The UTC midnight before which days are dropped now: the horizon, moved back to before
    the day of every hold (the end up to which a first-level rollup has aggregated, the first
    bucket start of its pending or running work), so no day still needed goes."""
    cut = retention_horizon(now, retention)
    for hold in holds:
        cut = min(cut, utc_midnight(hold))
    return cut


def bucket_cut(
    now: datetime,
    retention: timedelta,
    floor: Callable[[datetime], datetime],
    holds: Iterable[datetime],
) -> datetime:
    """The bucket boundary before which a rollup's buckets are dropped now: the start of the
    bucket holding `now - retention` (`floor` is the rollup's: the start of the bucket holding
    an instant), moved back to the start of the bucket of every hold (a watermark of the rollup
    or of a reader, the first bucket start of pending or running work), so no bucket still
    needed goes."""
    cut = floor(now - retention)
    for hold in holds:
        cut = min(cut, floor(hold))
    return cut


def removed_within(windows: Iterable[Window], removed: Sequence[Window]) -> list[Window]:
    """The parts of `windows` whose raw rows retention removed (merged, sorted)."""
    out = [
        Window(max(w.start, r.start), min(w.end, r.end))
        for w in windows
        for r in removed
        if w.overlaps(r)
    ]
    return merge_windows(out)


def describe_removed(removed: Sequence[Window]) -> str:
    """`before 2024-03-01T00:00:00Z` for the horizon, plus any other removed range."""
    parts = [
        f"before {w.end.isoformat().replace('+00:00', 'Z')}" if w.start <= BEGINNING else str(w)
        for w in merge_windows(list(removed))
    ]
    return ", ".join(parts) or "nothing"
