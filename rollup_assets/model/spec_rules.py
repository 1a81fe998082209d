"""The validation rules a catalog must pass at load.

Each failure is a `SpecError(archive, rule)`.
"""

import dataclasses
from datetime import datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rollup_assets.model.aggregates import PARTIALS, AggregateFunction
from rollup_assets.model.bucket_rules import check_fixed_size, check_nesting, longest_bucket
from rollup_assets.model.column_rules import check_computed_columns
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.durations import format_duration
from rollup_assets.model.errors import SpecError
from rollup_assets.model.names import column_name_problem, name_problem
from rollup_assets.model.specs import (
    Alignment,
    ArchiveSpec,
    Catalog,
    RawArchiveSpec,
    RollupSpec,
    Tenant,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import EPOCH


def validate_catalog(
    raw: dict[str, RawArchiveSpec],
    time_range: dict[str, TimeRangeArchiveSpec],
    rollups: dict[str, RollupSpec],
    origin: str,
    tenants: dict[str, Tenant] | None = None,
) -> Catalog:
    tenants = tenants or {}
    _check_tenants(tenants)
    seen: dict[str, str] = {}
    for kind, names in (("raw", raw), ("time_range", time_range), ("rollup", rollups)):
        for name in names:
            problem = name_problem(name)
            if problem is not None:
                raise SpecError(name, "archive name", f"archive name {problem}")
            if name in seen:
                raise SpecError(
                    name, "unique names", f"declared both as {seen[name]} and as {kind}"
                )
            seen[name] = kind
    values: list[RawArchiveSpec | TimeRangeArchiveSpec] = [*raw.values(), *time_range.values()]
    for spec in values:
        _check_value_columns(spec, origin)
    raw = {n: check_computed_columns(s) for n, s in raw.items()}
    time_range = {n: check_computed_columns(s) for n, s in time_range.items()}
    for spec in time_range.values():
        if spec.period is not None and spec.period <= timedelta(0):
            raise SpecError(spec.name, "period", "'period' must be positive")

    ordered = _dependency_order(rollups, set(raw) | set(time_range))
    resolved: dict[str, RollupSpec] = {}
    for name in ordered:
        resolved[name] = _check_rollup(rollups[name], raw, time_range, resolved)
    retained: list[ArchiveSpec] = [*values, *resolved.values()]
    for archive in retained:
        _check_retention(archive, [r for r in resolved.values() if r.source == archive.name])
    # Ingest checks each time-range row against the buckets of the rollups built from it.
    time_range = {
        name: dataclasses.replace(
            spec, first_levels=tuple(r for r in resolved.values() if r.source == name)
        )
        for name, spec in time_range.items()
    }
    return Catalog(raw=raw, time_range=time_range, rollups=resolved, origin=origin, tenants=tenants)


def _check_tenants(tenants: dict[str, Tenant]) -> None:
    """Tenant names are archive-like names (they become asset-key prefixes and parts of job,
    sensor and pool names). Whether tenants' roots overlap is decided where roots are resolved,
    against the configured warehouse (`rollup_assets.resources.warehouse.tenant_warehouses`)."""
    for name in tenants:
        problem = name_problem(name)
        if problem is not None:
            raise SpecError(f"tenants.{name}", "tenant name", f"tenant name {problem}")


def _check_retention(spec: ArchiveSpec, readers: list[RollupSpec]) -> None:
    """Rows (a raw day, a rollup's bucket) may only go once every rollup reading them has
    closed the buckets they fall in: the retention must be longer than each reader's longest
    bucket plus its watermark lag (otherwise the forward lane would aggregate a bucket whose
    rows are partly gone)."""
    if spec.retention is None:
        return
    if spec.retention <= timedelta(0):
        raise SpecError(spec.name, "retention", "'retention' must be positive")
    for rollup in readers:
        needed = longest_bucket(rollup) + rollup.watermark_lag
        if spec.retention <= needed:
            raise SpecError(
                spec.name,
                "retention",
                f"retention {format_duration(spec.retention)} must be longer than the longest "
                f"bucket plus watermark lag of rollup '{rollup.name}' reading it "
                f"({format_duration(needed)}): its rows would go before the bucket closes",
            )


def _check_value_columns(spec: RawArchiveSpec | TimeRangeArchiveSpec, origin: str) -> None:
    names = [c.name for c in spec.columns]
    for c in names:
        problem = column_name_problem(c)
        if problem is not None:
            raise SpecError(spec.name, "column name", f"{origin}: column {problem}")
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
        check_fixed_size(spec, zone)
    elif spec.size is not None:
        raise SpecError(
            spec.name, "size", f"'size' only applies to FixedSize, not {spec.alignment.value}"
        )
    elif spec.origin != EPOCH:
        raise SpecError(
            spec.name,
            "origin",
            f"'origin' only applies to FixedSize; {spec.alignment.value} buckets start at local "
            f"midnight in {spec.reference_time_zone}",
        )
    check_nesting(spec, source, zone)
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
        problem = column_name_problem(out)
        if problem is not None:
            raise SpecError(spec.name, "target name", f"target name {problem}")
        if out in outputs:
            raise SpecError(spec.name, "unique target names", f"two aggregations produce '{out}'")
        outputs.append(out)
    return types
