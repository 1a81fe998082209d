"""Downsampling steps: the coarser buckets a query merges a rollup's stored buckets into, or
aggregates a raw or time-range archive's rows into.

A step is `day`, `week` (ISO 8601, Monday to Sunday), `month` or `year` in a zone (a rollup's
reference zone; the zone a query over a raw or time-range archive names, UTC by default; DST
days last 23 or 25 hours), or a fixed duration (`15m`, `2h`, `PT6H`) counted in UTC from an
origin (a FixedSize rollup's declared origin, else the Unix epoch), as FixedSize buckets are.
A step must nest its source's buckets, by the same rule a rollup must nest its source's
(`bucket_rules.check_nesting`): each step is a whole number of a rollup's buckets, or of a
time-range archive's declared period (so no step splits a row's range); a raw archive's
readings are instants, which any step holds. Anything else is refused with `InvalidStepError`.
"""

import dataclasses
from collections.abc import Sequence
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from rollup_assets.model.bucket_rules import check_nesting
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.durations import format_duration, parse_duration
from rollup_assets.model.errors import InvalidStepError, InvalidTimeRangeError, SpecError
from rollup_assets.model.specs import (
    AggregationSpec,
    Alignment,
    ArchiveSpec,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import iso_utc

CALENDAR_STEPS = {
    "day": Alignment.CALENDAR_DAY,
    "week": Alignment.ISO8601_WEEK,
    "month": Alignment.CALENDAR_MONTH,
    "year": Alignment.CALENDAR_YEAR,
}
STEP_HELP = "day, week (ISO, from Monday), month, year (in the query's zone) or a duration (6h)"
# Where a query step's wall-clock geometry is sampled from (`bucket_rules.zone_offsets` looks at
# the zone's offsets for decades from this year on).
_STEP_EPOCH = datetime(1970, 1, 1)


def describe_step(step: RollupSpec) -> str:
    """How a user writes `step` (`day`, `month`, `6h`)."""
    if step.alignment is Alignment.FIXED_SIZE:
        assert step.size is not None
        return format_duration(step.size)
    return next(k for k, v in CALENDAR_STEPS.items() if v is step.alignment)


def step_spec(spec: RollupSpec, every: str | timedelta) -> RollupSpec:
    """The step `every` over rollup `spec`, as a rollup of `spec` with the step's buckets (its
    `source` is `spec`, its zone and aggregations `spec`'s). Raises InvalidStepError when
    `every` is not a step, or its buckets do not nest `spec`'s."""
    alignment, size = _parse(spec.name, every)
    step = dataclasses.replace(spec, source=spec.name, alignment=alignment, size=size)
    try:
        check_nesting(step, spec, ZoneInfo(spec.reference_time_zone))
    except SpecError as exc:
        reason = str(exc).split(f"over '{spec.name}': ", 1)[-1]
        raise InvalidStepError(
            f"cannot downsample '{spec.name}' ({_geometry(spec)}) by --every "
            f"{describe_step(step)}: its steps must be whole numbers of the rollup's buckets "
            f"({reason})"
        ) from None
    return step


def source_step_spec(
    source: RawArchiveSpec | TimeRangeArchiveSpec,
    every: str | timedelta,
    zone: str,
    aggregations: Sequence[AggregationSpec],
) -> RollupSpec:
    """The step `every` over a raw or time-range archive, as a rollup of it (named like it) with
    `aggregations` of its columns, calendar steps in IANA `zone` (checked by the caller). Raises
    InvalidStepError when `every` is not a step, or its steps would split the ranges of a
    time-range archive's declared period."""
    alignment, size = _parse(source.name, every)
    types = {}
    for agg in aggregations:
        column = source.column(agg.column)
        assert column is not None, f"{source.name}: no column {agg.column} (checked by the caller)"
        types[agg.column] = column.type
    step = RollupSpec(
        name=source.name,
        source=source.name,
        alignment=alignment,
        reference_time_zone=zone,
        start=_STEP_EPOCH,
        aggregations=tuple(aggregations),
        size=size,
        column_types=types,
    )
    try:
        check_nesting(step, source, ZoneInfo(zone))
    except SpecError as exc:
        # Only a declared period constrains a step (a raw archive's readings are instants).
        assert isinstance(source, TimeRangeArchiveSpec) and source.period is not None
        reason = str(exc).split(f"over '{source.name}': ", 1)[-1]
        raise InvalidStepError(
            f"cannot downsample '{source.name}' (period {format_duration(source.period)}) by "
            f"--every {describe_step(step)} in zone {zone}: its steps must be whole numbers of "
            f"the archive's ranges, so that no step splits a row ({reason})"
        ) from None
    return step


def check_step_range(
    spec: ArchiveSpec, step: RollupSpec, start: datetime | None, end: datetime | None
) -> None:
    """A downsampling query returns whole steps only: `start` and `end` (when given) must be
    step boundaries. Raises InvalidTimeRangeError naming the boundaries around a bad one."""
    b = Bucketing.of(step)
    for what, t in (("--from", start), ("--to", end)):
        if t is not None and not b.is_boundary(t):
            raise InvalidTimeRangeError(
                f"{what} {iso_utc(t)} is not a boundary of the {describe_step(step)} steps of "
                f"'{spec.name}' (zone {step.reference_time_zone}); the nearest are "
                f"{iso_utc(b.floor(t))} and {iso_utc(b.ceil(t))}"
            )


def _geometry(spec: RollupSpec) -> str:
    size = f" {format_duration(spec.size)}" if spec.size is not None else ""
    return f"alignment {spec.alignment.value}{size}, zone {spec.reference_time_zone}"


def _parse(archive: str, every: str | timedelta) -> tuple[Alignment, timedelta | None]:
    if isinstance(every, str) and every.strip().lower() in CALENDAR_STEPS:
        return CALENDAR_STEPS[every.strip().lower()], None
    try:
        size = parse_duration(every)
    except ValueError as exc:
        raise InvalidStepError(
            f"cannot downsample '{archive}': --every {every!r} is not a step ({STEP_HELP}); {exc}"
        ) from None
    if size <= timedelta(0):
        raise InvalidStepError(
            f"cannot downsample '{archive}': --every {every!r} must be a positive duration"
        )
    return Alignment.FIXED_SIZE, size
