"""Downsampling steps: the coarser buckets a query merges a rollup's stored buckets into.

A step is `day`, `week` (ISO 8601, Monday to Sunday), `month` or `year` in the rollup's reference
zone (DST days last 23 or 25 hours), or a fixed duration (`15m`, `2h`, `PT6H`) counted in UTC
from the rollup's origin (the Unix epoch unless a FixedSize rollup declares another), as
FixedSize buckets are. A step must nest the rollup's buckets, by the same
rule a rollup must nest its source's (`bucket_rules.check_nesting`): each step is a whole number
of the rollup's buckets. Anything else is refused with `InvalidStepError`.
"""

import dataclasses
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

from rollup_assets.model.bucket_rules import check_nesting
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.durations import format_duration, parse_duration
from rollup_assets.model.errors import InvalidStepError, InvalidTimeRangeError, SpecError
from rollup_assets.model.specs import Alignment, RollupSpec
from rollup_assets.model.windows import iso_utc

CALENDAR_STEPS = {
    "day": Alignment.CALENDAR_DAY,
    "week": Alignment.ISO8601_WEEK,
    "month": Alignment.CALENDAR_MONTH,
    "year": Alignment.CALENDAR_YEAR,
}
STEP_HELP = "day, week (ISO, from Monday), month, year (in the rollup's zone) or a duration (6h)"


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
    alignment, size = _parse(spec, every)
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


def check_step_range(
    spec: RollupSpec, step: RollupSpec, start: datetime | None, end: datetime | None
) -> None:
    """A downsampling query returns whole steps only: `start` and `end` (when given) must be
    step boundaries. Raises InvalidTimeRangeError naming the boundaries around a bad one."""
    b = Bucketing.of(step)
    for what, t in (("--from", start), ("--to", end)):
        if t is not None and not b.is_boundary(t):
            raise InvalidTimeRangeError(
                f"{what} {iso_utc(t)} is not a boundary of the {describe_step(step)} steps of "
                f"'{spec.name}' (zone {spec.reference_time_zone}); the nearest are "
                f"{iso_utc(b.floor(t))} and {iso_utc(b.ceil(t))}"
            )


def _geometry(spec: RollupSpec) -> str:
    size = f" {format_duration(spec.size)}" if spec.size is not None else ""
    return f"alignment {spec.alignment.value}{size}, zone {spec.reference_time_zone}"


def _parse(spec: RollupSpec, every: str | timedelta) -> tuple[Alignment, timedelta | None]:
    if isinstance(every, str) and every.strip().lower() in CALENDAR_STEPS:
        return CALENDAR_STEPS[every.strip().lower()], None
    try:
        size = parse_duration(every)
    except ValueError as exc:
        raise InvalidStepError(
            f"cannot downsample '{spec.name}': --every {every!r} is not a step ({STEP_HELP}); {exc}"
        ) from None
    if size <= timedelta(0):
        raise InvalidStepError(
            f"cannot downsample '{spec.name}': --every {every!r} must be a positive duration"
        )
    return Alignment.FIXED_SIZE, size
