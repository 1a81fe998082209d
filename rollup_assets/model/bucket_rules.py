"""The bucket geometry rules of a rollup spec: a FixedSize bucket must tile days in every UTC
offset its zone uses, and a rollup's buckets must nest in its source's buckets.

Each failure is a `SpecError(archive, rule)`.
"""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

from rollup_assets.model.errors import SpecError
from rollup_assets.model.specs import Alignment, ArchiveSpec, RollupSpec, TimeRangeArchiveSpec

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


def zone_offsets(zone: ZoneInfo, start: datetime, years: int = 80) -> set[timedelta]:
    """Every UTC offset `zone` uses from `start` on, sampled densely enough to see each rule."""
    t = datetime(max(start.year, 1900), 1, 1, tzinfo=UTC)
    end = t + timedelta(days=365 * years)
    offsets: set[timedelta] = set()
    while t < end:
        off = t.astimezone(zone).utcoffset()
        if off is not None:
            offsets.add(off)
        t += timedelta(days=5)
    return offsets


def check_fixed_size(spec: RollupSpec, zone: ZoneInfo) -> None:
    size = spec.size
    if size is None:
        raise SpecError(
            spec.name, "FixedSize needs size", "alignment FixedSize requires 'size' (e.g. 1h)"
        )
    if size < timedelta(minutes=1) or size % timedelta(minutes=1):
        raise SpecError(spec.name, "bucket size", f"size {size} must be a whole number of minutes")
    if size > DAY:
        raise SpecError(
            spec.name,
            "bucket size",
            f"FixedSize {size} is longer than a day; use CalendarDay, Iso8601Week or CalendarMonth",
        )
    divides = (HOUR % size == timedelta(0)) if size < HOUR else (DAY % size == timedelta(0))
    if not divides or (size >= HOUR and size % HOUR):
        raise SpecError(
            spec.name,
            "bucket size",
            f"FixedSize {size} must divide an hour (e.g. 15m) or be whole hours dividing a day",
        )
    bad = sorted(o for o in zone_offsets(zone, spec.start) if o % size)
    if bad:
        raise SpecError(
            spec.name,
            "offset-invariant FixedSize",
            f"FixedSize {size} is not offset-invariant in {zone.key}: it uses UTC offsets "
            f"{[str(o) for o in bad]} that are not multiples of the bucket, so local and UTC "
            "bucket boundaries would disagree",
        )


def _granularity(spec: ArchiveSpec) -> Alignment | timedelta | None:
    if isinstance(spec, RollupSpec):
        return spec.size if spec.alignment is Alignment.FIXED_SIZE else spec.alignment
    if isinstance(spec, TimeRangeArchiveSpec):
        return spec.period
    return None


def check_nesting(spec: RollupSpec, source: ArchiveSpec, zone: ZoneInfo) -> None:
    src = _granularity(source)
    if src is None:
        return
    here = spec.size if spec.alignment is Alignment.FIXED_SIZE else spec.alignment
    what = f"'{spec.name}' ({spec.alignment.value}) over '{source.name}'"
    if isinstance(here, timedelta) and isinstance(src, timedelta):
        if here < src:
            raise SpecError(
                spec.name, "bucket nests in source", f"{what}: {here} is finer than {src}"
            )
        if here % src:
            raise SpecError(
                spec.name,
                "bucket nests in source",
                f"{what}: {here} is not an integer multiple of {src}",
            )
    elif isinstance(here, timedelta):
        raise SpecError(
            spec.name,
            "bucket nests in source",
            f"{what}: a FixedSize bucket cannot be built from {src} buckets, whose length varies",
        )
    elif isinstance(src, timedelta):
        if DAY % src:
            raise SpecError(
                spec.name,
                "bucket nests in source",
                f"{what}: source buckets of {src} do not divide a day",
            )
        bad = sorted(o for o in zone_offsets(zone, spec.start) if o % src)
        if bad:
            raise SpecError(
                spec.name,
                "bucket nests in source",
                f"{what}: local midnight in {zone.key} is not a boundary of {src} source buckets",
            )
    else:
        assert isinstance(here, Alignment) and isinstance(src, Alignment)
        if src is Alignment.ISO8601_WEEK and here in (
            Alignment.CALENDAR_MONTH,
            Alignment.CALENDAR_YEAR,
        ):
            raise SpecError(
                spec.name,
                "bucket nests in source",
                f"{what}: ISO weeks straddle month and year ends; build months and years from days",
            )
        if _CALENDAR_RANK[here] < _CALENDAR_RANK[src] or (
            here is Alignment.ISO8601_WEEK and src is not Alignment.CALENDAR_DAY and src is not here
        ):
            raise SpecError(
                spec.name,
                "bucket nests in source",
                f"{what}: {here.value} is finer than {src.value}",
            )
