"""The validation rules a catalog must pass at load.

Each failure is a `SpecError(archive, rule)`.
"""

import dataclasses
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rollup_assets.errors import SpecError
from rollup_assets.specs import (
    PARTIALS,
    RESERVED_COLUMNS,
    AggregateFunction,
    Alignment,
    ArchiveSpec,
    Catalog,
    ColumnType,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
    is_valid_name,
)

HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
_CALENDAR_RANK = {
    Alignment.CALENDAR_DAY: 0,
    Alignment.ISO8601_WEEK: 1,
    Alignment.CALENDAR_MONTH: 1,
    Alignment.CALENDAR_YEAR: 2,
}


def validate_catalog(
    raw: dict[str, RawArchiveSpec],
    time_range: dict[str, TimeRangeArchiveSpec],
    rollups: dict[str, RollupSpec],
    origin: str,
) -> Catalog:
    seen: dict[str, str] = {}
    for kind, names in (("raw", raw), ("time_range", time_range), ("rollup", rollups)):
        for name in names:
            if not is_valid_name(name):
                raise SpecError(
                    name,
                    "archive name",
                    "names are lower-case identifiers (a-z, 0-9, _; no '__'), "
                    "at most 63 characters",
                )
            if name in seen:
                raise SpecError(
                    name, "unique names", f"declared both as {seen[name]} and as {kind}"
                )
            seen[name] = kind
    values: list[RawArchiveSpec | TimeRangeArchiveSpec] = [*raw.values(), *time_range.values()]
    for spec in values:
        _check_value_columns(spec)
    for spec in time_range.values():
        if spec.period is not None and spec.period <= timedelta(0):
            raise SpecError(spec.name, "period", "'period' must be positive")

    ordered = _dependency_order(rollups, set(raw) | set(time_range))
    resolved: dict[str, RollupSpec] = {}
    for name in ordered:
        resolved[name] = _check_rollup(rollups[name], raw, time_range, resolved)
    return Catalog(raw=raw, time_range=time_range, rollups=resolved, origin=origin)


def _check_value_columns(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> None:
    names = [c.name for c in spec.columns]
    for c in names:
        if not is_valid_name(c):
            raise SpecError(
                spec.name, "column name", f"column '{c}' is not a lower-case identifier"
            )
        if c in RESERVED_COLUMNS:
            raise SpecError(
                spec.name, "column name", f"column '{c}' is reserved by the storage layer"
            )
    dupes = {c for c in names if names.count(c) > 1}
    if dupes:
        raise SpecError(spec.name, "unique columns", f"columns declared twice: {sorted(dupes)}")


def _dependency_order(rollups: dict[str, RollupSpec], bases: set[str]) -> list[str]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = [*path[path.index(name) :], name]
            raise SpecError(name, "no cycles", "rollup sources form a cycle: " + " -> ".join(cycle))
        state[name] = "active"
        src = rollups[name].source
        if src in rollups:
            visit(src, [*path, name])
        elif src not in bases:
            known = ", ".join(sorted(bases | set(rollups))) or "none"
            raise SpecError(
                name, "known source", f"source '{src}' is not declared (known: {known})"
            )
        state[name] = "done"
        order.append(name)

    for name in rollups:
        visit(name, [])
    return order


def _zone(spec: RollupSpec) -> ZoneInfo:
    try:
        return ZoneInfo(spec.reference_time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise SpecError(
            spec.name,
            "reference_time_zone",
            f"'{spec.reference_time_zone}' is not an IANA time zone (e.g. Europe/Vienna, UTC)",
        ) from None


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


def _check_fixed_size(spec: RollupSpec, zone: ZoneInfo) -> None:
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


def _check_nesting(spec: RollupSpec, source: ArchiveSpec, zone: ZoneInfo) -> None:
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


def _check_rollup(
    spec: RollupSpec,
    raw: dict[str, RawArchiveSpec],
    time_range: dict[str, TimeRangeArchiveSpec],
    resolved: dict[str, RollupSpec],
) -> RollupSpec:
    zone = _zone(spec)
    source: ArchiveSpec = (
        raw.get(spec.source) or time_range.get(spec.source) or resolved[spec.source]
    )
    if spec.watermark_lag < timedelta(0):
        raise SpecError(spec.name, "watermark_lag", "'watermark_lag' must not be negative")
    start = spec.start
    if isinstance(source, RollupSpec):
        if source.reference_time_zone != spec.reference_time_zone:
            raise SpecError(
                spec.name,
                "one zone per chain",
                f"zone {spec.reference_time_zone} differs from source '{source.name}' "
                f"({source.reference_time_zone}); partitions cannot be mapped across zones",
            )
        if start == datetime.min:
            start = source.start
        elif start < source.start:
            raise SpecError(
                spec.name,
                "start",
                f"start {start:%Y-%m-%d %H:%M} is before source '{source.name}' starts",
            )
    elif start == datetime.min:
        raise SpecError(
            spec.name, "start", "the first rollup of a chain needs 'start' (e.g. 2024-01-01)"
        )
    spec = dataclasses.replace(spec, start=start)

    if spec.alignment is Alignment.FIXED_SIZE:
        _check_fixed_size(spec, zone)
    elif spec.size is not None:
        raise SpecError(
            spec.name, "size", f"'size' only applies to FixedSize, not {spec.alignment.value}"
        )
    _check_nesting(spec, source, zone)
    column_types = _check_aggregations(spec, source)
    return dataclasses.replace(spec, column_types=column_types)


def _check_aggregations(spec: RollupSpec, source: ArchiveSpec) -> dict[str, ColumnType]:
    types: dict[str, ColumnType] = {}
    outputs: list[str] = []
    for agg in spec.aggregations:
        if isinstance(source, RollupSpec):
            ctype = source.column_types.get(agg.column)
            missing = [
                p for p in PARTIALS[agg.function] if source.partial_column(agg.column, p) is None
            ]
            if ctype is None or missing:
                raise SpecError(
                    spec.name,
                    "known column",
                    f"{agg.function.value}({agg.column}) needs the "
                    f"{'/'.join(missing) or 'partials'} of "
                    f"'{agg.column}' from source rollup '{source.name}', "
                    "which does not aggregate it so",
                )
        else:
            col = source.column(agg.column)
            if col is None:
                known = ", ".join(c.name for c in source.columns)
                raise SpecError(
                    spec.name,
                    "known column",
                    f"column '{agg.column}' is not in source '{source.name}' (columns: {known})",
                )
            ctype = col.type
        if agg.function is not AggregateFunction.COUNT and not ctype.is_numeric:
            raise SpecError(
                spec.name,
                "numeric aggregation",
                f"{agg.function.value}({agg.column}) needs a numeric column; '{agg.column}' is "
                f"{ctype.value} (only Count applies to it)",
            )
        types[agg.column] = ctype
        out = agg.output_name
        if not is_valid_name(out) or out in RESERVED_COLUMNS:
            raise SpecError(
                spec.name, "target name", f"target name '{out}' is not a usable column name"
            )
        if out in outputs:
            raise SpecError(spec.name, "unique target names", f"two aggregations produce '{out}'")
        outputs.append(out)
    return types
