"""What a downsampling query computes and in which zone: `--agg COLUMN:FUNCTION` and `--zone`
checked against the archive the query reads.

Over a raw or time-range archive any value column may be aggregated by the five functions, by
the rule a rollup's aggregations obey: Sum, Avg, Min and Max need a numeric column (double, long,
int); Count applies to every column. Over a rollup, `--agg` picks among the rollup's own
aggregations: its stored partials are all a step can be merged from. A function is named in any
case (`sum`, `Sum`); the output column is named as in rollups, `<column>_<function>` in lower
case (or the `target` a rollup's aggregation sets).

Calendar steps over a raw or time-range archive follow the query's zone (an IANA zone, UTC by
default); a rollup's steps follow its reference zone, the only zone its buckets nest in.
"""

from collections.abc import Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.errors import InvalidAggregationError, InvalidTimeZoneError
from rollup_assets.model.specs import (
    AggregationSpec,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
)

# One aggregation as a user writes it: "energy_kwh:sum", or ("energy_kwh", "sum") from Python.
Aggregate = str | tuple[str, str]
FUNCTIONS = {f.value.lower(): f for f in AggregateFunction}
FUNCTION_NAMES = ", ".join(FUNCTIONS)
DEFAULT_ZONE = "UTC"


def parse_aggregate(archive: str, agg: Aggregate) -> tuple[str, AggregateFunction]:
    """The column and function of one `COLUMN:FUNCTION`; InvalidAggregationError naming a text
    that is not of that form, or a function that is not one of the five."""
    if isinstance(agg, tuple) and len(agg) == 2:
        column, function, shown = str(agg[0]), str(agg[1]), f"{agg[0]}:{agg[1]}"
    else:
        shown = str(agg)
        column, colon, function = shown.partition(":")
        if not colon:
            raise InvalidAggregationError(
                f"cannot aggregate '{archive}': --agg {shown!r} is not COLUMN:FUNCTION "
                f"(e.g. energy_kwh:sum; functions: {FUNCTION_NAMES})"
            )
    column, function = column.strip(), function.strip()
    found = FUNCTIONS.get(function.lower())
    if found is None:
        raise InvalidAggregationError(
            f"cannot aggregate '{archive}': --agg {shown!r}: {function!r} is not an aggregate "
            f"function (one of {FUNCTION_NAMES})"
        )
    if not column:
        raise InvalidAggregationError(
            f"cannot aggregate '{archive}': --agg {shown!r} names no column (COLUMN:FUNCTION)"
        )
    return column, found


def source_aggregations(
    source: RawArchiveSpec | TimeRangeArchiveSpec, aggs: Sequence[Aggregate]
) -> tuple[AggregationSpec, ...]:
    """The aggregations `aggs` of `source`'s value columns (the columns its table applies), in
    the order given. Raises InvalidAggregationError for none at all (saying what to add), an
    unknown column (listing the archive's), a function the column's type does not support, or
    one given twice."""
    known = ", ".join(c.name for c in source.columns) or "none"
    if not aggs:
        example = next((c.name for c in source.columns if c.type.is_numeric), "COLUMN")
        raise InvalidAggregationError(
            f"'{source.name}' is a {source.kind.value.replace('_', '-')} archive: --every "
            f"aggregates its rows, so add what to compute: --agg COLUMN:FUNCTION (repeatable; "
            f"e.g. --agg {example}:sum; columns: {known}; functions: {FUNCTION_NAMES})"
        )
    out: list[AggregationSpec] = []
    for agg in aggs:
        column, function = parse_aggregate(source.name, agg)
        spec = source.column(column)
        if spec is None:
            raise InvalidAggregationError(
                f"cannot aggregate '{source.name}': no column {column!r} (columns: {known})"
            )
        if function is not AggregateFunction.COUNT and not spec.type.is_numeric:
            raise InvalidAggregationError(
                f"cannot aggregate '{source.name}': {function.value}({column}) needs a numeric "
                f"column; '{column}' is {spec.type.value} (only count applies to it)"
            )
        out.append(AggregationSpec(column, function))
    return _unique(source.name, out)


def rollup_aggregations(spec: RollupSpec, aggs: Sequence[Aggregate]) -> tuple[AggregationSpec, ...]:
    """The aggregations of rollup `spec` that `aggs` pick (all of them when `aggs` is empty), in
    the order given. Raises InvalidAggregationError for one the rollup does not keep (listing
    the ones it does)."""
    if not aggs:
        return spec.aggregations
    offered = ", ".join(f"{a.column}:{a.function.value.lower()}" for a in spec.aggregations)
    picked: list[AggregationSpec] = []
    for agg in aggs:
        column, function = parse_aggregate(spec.name, agg)
        found = [a for a in spec.aggregations if a.column == column and a.function is function]
        if not found:
            raise InvalidAggregationError(
                f"cannot aggregate '{spec.name}': it keeps no {function.value}({column}); a "
                f"rollup's steps are merged from its stored aggregations ({offered}); query its "
                "raw archive for others"
            )
        picked += found
    return _unique(spec.name, picked)


def query_zone(archive: str, zone: str | None) -> str:
    """The zone a query over a raw or time-range archive puts its calendar steps in: `zone`,
    when it is an IANA time zone, or UTC when None. InvalidTimeZoneError names a bad one."""
    if zone is None:
        return DEFAULT_ZONE
    try:
        ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise InvalidTimeZoneError(
            f"cannot query '{archive}': --zone {zone!r} is not an IANA time zone "
            "(e.g. Europe/Vienna, UTC)"
        ) from None
    return zone


def check_rollup_zone(spec: RollupSpec, zone: str | None) -> None:
    """A rollup's steps are merged from its buckets, which nest only in its reference zone:
    `zone` must be None or that zone (InvalidTimeZoneError otherwise)."""
    if zone is None:
        return
    query_zone(spec.name, zone)
    if zone != spec.reference_time_zone:
        raise InvalidTimeZoneError(
            f"cannot downsample '{spec.name}' in --zone {zone}: its buckets are kept in "
            f"{spec.reference_time_zone}, the zone its steps follow (omit --zone, or query the "
            "raw archive it is built from with --zone)"
        )


def _unique(archive: str, aggs: list[AggregationSpec]) -> tuple[AggregationSpec, ...]:
    seen: set[str] = set()
    for agg in aggs:
        if agg.output_name in seen:
            raise InvalidAggregationError(
                f"cannot aggregate '{archive}': {agg.column}:{agg.function.value.lower()} is "
                "given twice"
            )
        seen.add(agg.output_name)
    return tuple(aggs)
