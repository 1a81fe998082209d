"""Bucket alignment + reference zone -> Dagster partitions, and bucket arithmetic in UTC.

`Bucketing` is the pure arithmetic (floor a UTC instant to its bucket, step to the next one) used
by sensors, the Spark transforms and the read path; `partitions_def_for` turns the same alignment
into the Dagster partitions definition. Tests check that the two agree across DST switches.
All instants passed in and out are aware `datetime`s in UTC; windows are half-open `[start, end)`.
"""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import cached_property
from zoneinfo import ZoneInfo

import dagster as dg

from rollup_assets.specs import Alignment, RollupSpec

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True, order=True)
class Window:
    """A half-open UTC interval `[start, end)`."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        if self.start.tzinfo is None or self.end.tzinfo is None:
            raise ValueError("Window bounds must be timezone-aware")

    def overlaps(self, other: "Window") -> bool:
        return self.start < other.end and other.start < self.end

    def __str__(self) -> str:
        return f"[{iso_utc(self.start)}, {iso_utc(self.end)})"


def iso_utc(t: datetime) -> str:
    """ISO-8601 in UTC with a `Z` suffix, seconds precision unless there are fractions."""
    t = t.astimezone(UTC)
    text = t.isoformat(timespec="microseconds" if t.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def as_utc(t: datetime) -> datetime:
    """Normalize: naive means UTC, aware is converted."""
    return t.replace(tzinfo=UTC) if t.tzinfo is None else t.astimezone(UTC)


@dataclass(frozen=True)
class Bucketing:
    alignment: Alignment
    zone: ZoneInfo
    size: timedelta | None = None

    @classmethod
    def of(cls, spec: RollupSpec) -> "Bucketing":
        return cls(spec.alignment, ZoneInfo(spec.reference_time_zone), spec.size)

    def floor(self, t: datetime) -> datetime:
        """Start (UTC) of the bucket containing instant `t`."""
        t = as_utc(t)
        if self.alignment is Alignment.FIXED_SIZE:
            assert self.size is not None
            # Offset-invariance is validated, so flooring in UTC equals flooring in local time.
            step = self.size // timedelta(microseconds=1)
            micros = (t - EPOCH) // timedelta(microseconds=1)
            return EPOCH + timedelta(microseconds=micros - micros % step)
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

    def _local_midnight(self, d: date) -> datetime:
        return datetime.combine(d, time(0), tzinfo=self.zone).astimezone(UTC)

    @cached_property
    def nominal(self) -> timedelta:
        """A typical bucket length, for estimates only (a month is 30 days here)."""
        return (
            self.size
            or {
                Alignment.CALENDAR_DAY: timedelta(days=1),
                Alignment.ISO8601_WEEK: timedelta(days=7),
                Alignment.CALENDAR_MONTH: timedelta(days=30),
                Alignment.CALENDAR_YEAR: timedelta(days=365),
            }[self.alignment]
        )


def merge_windows(windows: "list[Window] | set[Window]") -> list[Window]:
    """Union of windows as sorted, disjoint, non-adjacent intervals."""
    out: list[Window] = []
    for w in sorted(windows):
        if out and w.start <= out[-1].end:
            if w.end > out[-1].end:
                out[-1] = Window(out[-1].start, w.end)
        else:
            out.append(w)
    return out


# ---------------------------------------------------------------------------------------------
# Dagster partitions


def _fmt(spec: RollupSpec) -> str:
    if spec.alignment is Alignment.FIXED_SIZE:
        return "%Y-%m-%d-%H:%M"
    if spec.alignment is Alignment.CALENDAR_YEAR:
        return "%Y"
    return "%Y-%m-%d"


def _cron(spec: RollupSpec) -> str:
    if spec.alignment is Alignment.FIXED_SIZE:
        assert spec.size is not None
        minutes = int(spec.size.total_seconds() // 60)
        if minutes < 60:
            return f"*/{minutes} * * * *" if minutes > 1 else "* * * * *"
        hours = minutes // 60
        return "0 * * * *" if hours == 1 else f"0 */{hours} * * *"
    return {
        Alignment.CALENDAR_DAY: "0 0 * * *",
        Alignment.ISO8601_WEEK: "0 0 * * 1",
        Alignment.CALENDAR_MONTH: "0 0 1 * *",
        Alignment.CALENDAR_YEAR: "0 0 1 1 *",
    }[spec.alignment]


def first_bucket_start(spec: RollupSpec) -> datetime:
    """UTC start of the first partition: the first bucket boundary at or after `spec.start`."""
    zone = ZoneInfo(spec.reference_time_zone)
    local_start = spec.start.replace(tzinfo=zone).astimezone(UTC)
    return Bucketing.of(spec).ceil(local_start)


def partitions_def_for(spec: RollupSpec) -> dg.TimeWindowPartitionsDefinition:
    """Partitions = buckets in the reference zone; `end_offset=1` makes the open bucket a key."""
    zone = ZoneInfo(spec.reference_time_zone)
    return dg.TimeWindowPartitionsDefinition(
        # An instant, not a formatted key: a key in the repeated hour of a DST fall-back day
        # would be read as its first occurrence, one bucket too early.
        start=first_bucket_start(spec).astimezone(zone),
        fmt=_fmt(spec),
        cron_schedule=_cron(spec),
        timezone=spec.reference_time_zone,
        end_offset=1,
    )


def window_of_key(pdef: dg.TimeWindowPartitionsDefinition, key: str) -> Window:
    tw = pdef.time_window_for_partition_key(key)
    return Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))


def key_of_window(pdef: dg.TimeWindowPartitionsDefinition, start: datetime) -> str:
    return pdef.get_partition_key_for_timestamp(as_utc(start).timestamp())


def key_range_for(
    pdef: dg.TimeWindowPartitionsDefinition, windows: list[Window]
) -> dg.PartitionKeyRange:
    """The partition key range spanning the given bucket windows (their hull)."""
    lo = min(w.start for w in windows)
    hi = max(w.start for w in windows)
    return dg.PartitionKeyRange(key_of_window(pdef, lo), key_of_window(pdef, hi))
