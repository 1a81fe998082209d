"""Bucket arithmetic in UTC: floor an instant to its bucket, step to the next one.

A FixedSize bucket is an absolute duration counted from the rollup's origin (the Unix epoch
unless the spec declares one); the reference zone does not move it. Calendar buckets follow
local midnights in the reference zone.

The same alignment becomes the Dagster partitions definition in the orchestration layer (one
partition per bucket, or a whole number of them: `model.grid`); tests check that the two agree
across DST switches.
"""

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from enum import StrEnum
from zoneinfo import ZoneInfo

from rollup_assets.model.specs import Alignment, RollupSpec
from rollup_assets.model.windows import EPOCH, Window, as_utc


@dataclass(frozen=True)
class Bucketing:
    alignment: Alignment
    zone: ZoneInfo
    size: timedelta | None = None
    origin: datetime = EPOCH  # FixedSize: a bucket boundary (UTC); every other is size apart

    @classmethod
    def of(cls, spec: RollupSpec) -> "Bucketing":
        return cls(spec.alignment, ZoneInfo(spec.reference_time_zone), spec.size, spec.origin)

    def floor(self, t: datetime) -> datetime:
        """Start (UTC) of the bucket containing instant `t`."""
        t = as_utc(t)
        if self.alignment is Alignment.FIXED_SIZE:
            assert self.size is not None
            # An absolute duration from the origin: the zone's offsets do not move it. Python's
            # `%` floors, so an instant before the origin falls in the bucket that holds it too.
            step = self.size // timedelta(microseconds=1)
            since = (t - self.origin) // timedelta(microseconds=1)
            return t - timedelta(microseconds=since % step)
        local = t.astimezone(self.zone)
        d = local.date()
        if self.alignment is Alignment.ISO8601_WEEK:
            d = d - timedelta(days=d.weekday())
        elif self.alignment is Alignment.CALENDAR_MONTH:
            d = d.replace(day=1)
        elif self.alignment is Alignment.CALENDAR_YEAR:
            d = d.replace(month=1, day=1)
        start = self._local_midnight(d)
        # A zone whose midnight is skipped by DST can put `start` after `t`; step back a unit.
        return start if start <= t else self.floor(start - timedelta(microseconds=1))

    def next_start(self, start: datetime) -> datetime:
        """Start of the bucket following the one that starts at `start` (UTC)."""
        start = as_utc(start)
        if self.alignment is Alignment.FIXED_SIZE:
            assert self.size is not None
            return start + self.size
        d = start.astimezone(self.zone).date()
        if self.alignment is Alignment.CALENDAR_DAY:
            nd = d + timedelta(days=1)
        elif self.alignment is Alignment.ISO8601_WEEK:
            nd = d + timedelta(days=7)
        elif self.alignment is Alignment.CALENDAR_MONTH:
            nd = date(d.year + d.month // 12, d.month % 12 + 1, 1)
        else:
            nd = date(d.year + 1, 1, 1)
        return self._local_midnight(nd)

    def prev_start(self, start: datetime) -> datetime:
        return self.floor(as_utc(start) - timedelta(microseconds=1))

    def window_of(self, t: datetime) -> Window:
        s = self.floor(t)
        return Window(s, self.next_start(s))

    def windows_of(self, times: Sequence[datetime]) -> list[Window]:
        """`window_of` each of `times` (many instants, few buckets: each bucket is worked out
        once, walking the distinct instants in order)."""
        known: dict[datetime, Window] = {}
        current: Window | None = None
        for t in sorted(set(times)):
            if current is None or not current.start <= t < current.end:
                current = self.window_of(t)
            known[t] = current
        return [known[t] for t in times]

    def ceil(self, t: datetime) -> datetime:
        """Smallest bucket boundary >= `t`."""
        s = self.floor(t)
        return s if s == as_utc(t) else self.next_start(s)

    def is_boundary(self, t: datetime) -> bool:
        return self.floor(t) == as_utc(t)

    def windows(self, start: datetime, end: datetime) -> Iterator[Window]:
        """Every bucket intersecting `[start, end)`, in order."""
        s = self.floor(start)
        end = as_utc(end)
        while s < end:
            n = self.next_start(s)
            yield Window(s, n)
            s = n

    def boundaries_near(self, days: Iterable[date]) -> list[datetime]:
        """Sorted UTC bucket boundaries around the UTC `days`: for each day, from the start of
        the bucket holding its first instant to the first boundary at or after its end. So the
        next boundary after any instant of those days is in the list (each day's buckets are
        enumerated: a handful for calendar buckets, 96 a day for 15-minute ones). A bucket
        reaching past the years 1 to 9999 adds no boundary there: none is representable."""
        out: set[datetime] = set()
        for d in days:
            first = datetime.combine(d, time(0), tzinfo=UTC)
            last = datetime.combine(d, time.max, tzinfo=UTC)
            try:
                s = self.floor(first)
                out.add(s)
                while s <= last:
                    s = self.next_start(s)
                    out.add(s)
            except (OverflowError, ValueError):
                continue  # past the years 1 to 9999: no boundary is representable there
        return sorted(out)

    def _local_midnight(self, d: date) -> datetime:
        return datetime.combine(d, time(0), tzinfo=self.zone).astimezone(UTC)


def first_bucket_start(spec: RollupSpec) -> datetime:
    """UTC start of the first partition: the first bucket boundary at or after `spec.start`."""
    zone = ZoneInfo(spec.reference_time_zone)
    local_start = spec.start.replace(tzinfo=zone).astimezone(UTC)
    return Bucketing.of(spec).ceil(local_start)


class StorageUnit(StrEnum):
    """The span of one physical partition of a rollup's tables (a UTC day, month or year)."""

    DAY = "day"
    MONTH = "month"
    YEAR = "year"


def storage_unit(spec: RollupSpec) -> StorageUnit:
    """How a rollup's tables are partitioned: by UTC day for buckets of a day or less, by UTC
    month for buckets of one to a few days (local days, FixedSize buckets under a week), by UTC
    year for longer ones. A bucket lies in the partition of its start, even when it ends in the
    next one: every writer and reader places a bucket by its `bucket_start` alone."""
    if spec.alignment is Alignment.FIXED_SIZE:
        assert spec.size is not None
        if spec.size <= timedelta(days=1):
            return StorageUnit.DAY
        return StorageUnit.MONTH if spec.size < timedelta(days=7) else StorageUnit.YEAR
    return StorageUnit.MONTH if spec.alignment is Alignment.CALENDAR_DAY else StorageUnit.YEAR


def storage_partition(spec: RollupSpec, t: datetime) -> Window:
    """The physical partition (`storage_unit`) of the rollup's tables holding a bucket that
    starts at `t` (UTC; the last one ends at the last representable instant)."""
    t = as_utc(t)
    unit = storage_unit(spec)
    try:
        if unit is StorageUnit.DAY:
            start = t.replace(hour=0, minute=0, second=0, microsecond=0)
            return Window(start, start + timedelta(days=1))
        if unit is StorageUnit.MONTH:
            start = t.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
            end = start.replace(year=start.year + start.month // 12, month=start.month % 12 + 1)
            return Window(start, end)
        start = t.replace(month=1, day=1, hour=0, minute=0, second=0, microsecond=0)
        return Window(start, start.replace(year=start.year + 1))
    except (OverflowError, ValueError):
        return Window(start, datetime.max.replace(tzinfo=UTC))
