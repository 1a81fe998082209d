"""The bucket geometry rules of a rollup spec: a FixedSize bucket is a whole number of minutes
from its origin that Dagster can partition in its zone, and a rollup's buckets must nest in its
source's buckets (every boundary of the rollup is a boundary of its source).

Each failure is a `SpecError(archive, rule)`.
"""

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import SpecError
from rollup_assets.model.grid import MAX_PARTITIONS_PER_BUCKET, partition_grid, zone_offsets
from rollup_assets.model.specs import Alignment, ArchiveSpec, RollupSpec, TimeRangeArchiveSpec
from rollup_assets.model.windows import EPOCH, iso_utc

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
_CALENDAR_RANK = {
    Alignment.CALENDAR_DAY: 0,
    Alignment.ISO8601_WEEK: 1,
    Alignment.CALENDAR_MONTH: 1,
    Alignment.CALENDAR_YEAR: 2,
}


# The longest a calendar bucket can be, a DST hour included.
_LONGEST = {
    Alignment.CALENDAR_DAY: DAY + HOUR,
    Alignment.ISO8601_WEEK: 7 * DAY + HOUR,
    Alignment.CALENDAR_MONTH: 31 * DAY + HOUR,
    Alignment.CALENDAR_YEAR: 366 * DAY + HOUR,
}


def longest_bucket(spec: RollupSpec) -> timedelta:
    """The longest any bucket of `spec` lasts (in UTC time)."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return spec.size or timedelta(0)
    return _LONGEST[spec.alignment]


# How late a rollup's newest materialization may be, past its longest bucket and watermark lag,
# before it is reported: the forward lane closes a bucket on the first sensor tick after its
# lag, so minutes of slack are plenty; the failure margin leaves room for a busy daemon.
FRESHNESS_WARN_SLACK = timedelta(minutes=5)
FRESHNESS_FAIL_SLACK = timedelta(minutes=30)


def freshness_windows(spec: RollupSpec) -> tuple[timedelta, timedelta]:
    """(warn, fail): how old a rollup's newest materialization may be while the chain keeps up.

    A bucket closes one watermark lag after it ends, and each close (or open-bucket refresh)
    materializes the rollup, so a rollup that keeps up materializes at least once per longest
    bucket plus lag.
    """
    due = longest_bucket(spec) + spec.watermark_lag
    return due + FRESHNESS_WARN_SLACK, due + FRESHNESS_FAIL_SLACK


# The longest FixedSize bucket: a week. Longer periods are calendar weeks, months and years;
# and a week of hours is the most partitions a bucket may take (`grid.MAX_PARTITIONS_PER_BUCKET`).
MAX_FIXED_SIZE = 7 * DAY


def check_fixed_size(spec: RollupSpec, zone: ZoneInfo) -> None:
    """A FixedSize bucket is a whole number of minutes, from a minute to a week, counted from
    an origin on a whole minute; its zone only decides how Dagster partitions it (`grid`), and
    a bucket must be at most `MAX_PARTITIONS_PER_BUCKET` partitions there."""
    size = spec.size
    if size is None:
        raise SpecError(
            spec.name, "FixedSize needs size", "alignment FixedSize requires 'size' (e.g. 1h)"
        )
    if size < MINUTE or size % MINUTE:
        raise SpecError(spec.name, "bucket size", f"size {size} must be a whole number of minutes")
    if size > MAX_FIXED_SIZE:
        raise SpecError(
            spec.name,
            "bucket size",
            f"FixedSize {format_duration(size)} is longer than {format_duration(MAX_FIXED_SIZE)}; "
            "use Iso8601Week, CalendarMonth or CalendarYear",
        )
    if (spec.origin - EPOCH) % MINUTE:
        raise SpecError(
            spec.name, "origin", f"origin {iso_utc(spec.origin)} must be a whole minute"
        )
    grid = partition_grid(spec)
    geometry = f"FixedSize {format_duration(size)} from origin {iso_utc(spec.origin)}"
    if grid is None:
        raise SpecError(
            spec.name,
            "partitions align with buckets",
            f"{geometry}: no cron schedule in {zone.key} starts a Dagster partition at every "
            "bucket boundary (a UTC offset the zone uses is not a whole number of minutes)",
        )
    if grid.per_bucket > MAX_PARTITIONS_PER_BUCKET:
        raise SpecError(
            spec.name,
            "partitions align with buckets",
            f"{geometry} would need Dagster partitions of {format_duration(grid.step)} in "
            f"{zone.key}, {grid.per_bucket} per bucket (at most {MAX_PARTITIONS_PER_BUCKET}): "
            "no coarser cron schedule there starts a partition at every bucket boundary; "
            "choose a shorter size, or one of whole hours where the zone's offsets differ by "
            "whole hours",
        )


def _granularity(spec: ArchiveSpec) -> Alignment | tuple[timedelta, datetime] | None:
    """A source's buckets: a calendar alignment, or (size, origin) of fixed ones (a time-range
    archive's period counts from the epoch), or None for a source without a granularity."""
    if isinstance(spec, RollupSpec):
        if spec.alignment is Alignment.FIXED_SIZE:
            assert spec.size is not None
            return spec.size, spec.origin
        return spec.alignment
    if isinstance(spec, TimeRangeArchiveSpec) and spec.period is not None:
        return spec.period, EPOCH
    return None


def check_nesting(spec: RollupSpec, source: ArchiveSpec, zone: ZoneInfo) -> None:
    """Every bucket boundary of `spec` is a bucket boundary of `source` (in every UTC offset
    of `zone`), so a source bucket never straddles two of the rollup's."""
    src = _granularity(source)
    if src is None:
        return
    here = (spec.size, spec.origin) if spec.alignment is Alignment.FIXED_SIZE else spec.alignment
    what = f"'{spec.name}' ({spec.alignment.value}) over '{source.name}'"

    def refuse(reason: str) -> SpecError:
        return SpecError(spec.name, "bucket nests in source", f"{what}: {reason}")

    if isinstance(here, tuple) and isinstance(src, tuple):
        (size, origin), (src_size, src_origin) = here, src
        assert size is not None
        if size < src_size:
            raise refuse(f"{size} is finer than {src_size}")
        if size % src_size:
            raise refuse(f"{size} is not an integer multiple of {src_size}")
        if (origin - src_origin) % src_size:
            raise refuse(
                f"origin {iso_utc(origin)} is not a boundary of the {format_duration(src_size)} "
                f"source buckets, counted from {iso_utc(src_origin)}"
            )
    elif isinstance(here, tuple):
        raise refuse(f"a FixedSize bucket cannot be built from {src} buckets, whose length varies")
    elif isinstance(src, tuple):
        src_size, src_origin = src
        if DAY % src_size:
            raise refuse(f"source buckets of {src_size} do not divide a day")
        # Local midnight is UTC midnight minus the offset in force: a source boundary only if
        # that is `src_origin (mod src_size)` for every offset the zone uses.
        bad = sorted(
            o for o in zone_offsets(zone, spec.start) if (-o - (src_origin - EPOCH)) % src_size
        )
        if bad:
            counted = "" if src_origin == EPOCH else f" counted from {iso_utc(src_origin)}"
            raise refuse(
                f"local midnight in {zone.key} is not a boundary of {src_size} source "
                f"buckets{counted}"
            )
    else:
        assert isinstance(here, Alignment) and isinstance(src, Alignment)
        if src is Alignment.ISO8601_WEEK and here in (
            Alignment.CALENDAR_MONTH,
            Alignment.CALENDAR_YEAR,
        ):
            raise refuse("ISO weeks straddle month and year ends; build months and years from days")
        if _CALENDAR_RANK[here] < _CALENDAR_RANK[src] or (
            here is Alignment.ISO8601_WEEK and src is not Alignment.CALENDAR_DAY and src is not here
        ):
            raise refuse(f"{here.value} is finer than {src.value}")
