"""One archive's declaration in a spec, parsed into its typed spec: a raw or time-range
archive's columns (ingested, or computed by a formula), a rollup's buckets and aggregations.

Each failure is a `SpecError` naming the archive and the rule; the rules between archives (a
rollup's source, nesting, names) are `spec_rules`'.
"""

from collections.abc import Mapping
from datetime import UTC, date, datetime, timedelta
from typing import Any

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.durations import parse_duration
from rollup_assets.model.errors import SpecError
from rollup_assets.model.formulas import Formula, FormulaSyntaxError, parse_formula
from rollup_assets.model.specs import (
    AggregationSpec,
    Alignment,
    ColumnSpec,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import EPOCH


def parse_raw_archive(name: str, body: Any) -> RawArchiveSpec:
    """The raw archive `name` declared by `body` (its mapping under `raw_archives`)."""
    b = _mapping(name, body, {"columns", "description", "retention"})
    return RawArchiveSpec(
        name=name,
        columns=_columns(name, b),
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


def parse_time_range_archive(name: str, body: Any) -> TimeRangeArchiveSpec:
    """The time-range archive `name` declared by `body` (under `time_range_archives`)."""
    b = _mapping(name, body, {"columns", "description", "period", "retention"})
    period = _duration(name, "period", b.get("period")) if b.get("period") is not None else None
    return TimeRangeArchiveSpec(
        name=name,
        columns=_columns(name, b),
        period=period,
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


_ROLLUP_KEYS = {
    "source",
    "alignment",
    "size",
    "origin",
    "reference_time_zone",
    "watermark_lag",
    "refresh_open_bucket",
    "start",
    "aggregations",
    "description",
    "retention",
}


def parse_rollup(name: str, body: Any) -> RollupSpec:
    """The rollup `name` declared by `body` (under `rollups`); its source and the rules between
    archives are checked when the catalog is validated."""
    b = _mapping(name, body, _ROLLUP_KEYS)
    if not b.get("source"):
        raise SpecError(name, "source is set", "a rollup needs a 'source' archive")
    try:
        alignment = Alignment(str(b.get("alignment")))
    except ValueError:
        raise SpecError(
            name,
            "alignment",
            f"alignment {b.get('alignment')!r} is not one of {[a.value for a in Alignment]}",
        ) from None
    aggs_raw = b.get("aggregations")
    if not isinstance(aggs_raw, list) or not aggs_raw:
        raise SpecError(name, "has aggregations", "'aggregations' must be a non-empty list")
    aggs = tuple(_aggregation(name, i, a) for i, a in enumerate(aggs_raw))
    refresh = b.get("refresh_open_bucket", True)
    if not isinstance(refresh, bool):
        raise SpecError(name, "refresh_open_bucket", "'refresh_open_bucket' must be true or false")
    return RollupSpec(
        name=name,
        source=str(b["source"]),
        alignment=alignment,
        size=_duration(name, "size", b["size"]) if b.get("size") is not None else None,
        origin=_origin(name, b.get("origin")),
        reference_time_zone=str(b.get("reference_time_zone", "UTC")),
        watermark_lag=_duration(name, "watermark_lag", b.get("watermark_lag", "0s")),
        refresh_open_bucket=refresh,
        start=_start(name, b.get("start")),
        aggregations=aggs,
        description=str(b.get("description", "")),
        retention=_retention(name, b),
    )


def _mapping(name: str, body: Any, allowed: set[str]) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise SpecError(name, "archive body is a mapping", "the archive spec must be a mapping")
    unknown = set(body) - allowed
    if unknown:
        raise SpecError(
            name, "known keys", f"unknown keys {sorted(unknown)}; allowed: {sorted(allowed)}"
        )
    return body


def _columns(name: str, body: Mapping[str, Any]) -> tuple[ColumnSpec, ...]:
    cols = body.get("columns")
    if not isinstance(cols, Mapping) or not cols:
        raise SpecError(
            name, "has value columns", "'columns' must map at least one column name to its type"
        )
    out = []
    for col, decl in cols.items():
        if isinstance(decl, str):
            decl = {"type": decl}
        if not isinstance(decl, Mapping):
            raise SpecError(
                name, "column declaration", f"column '{col}' must be a type or a mapping"
            )
        bad = set(decl) - {"type", "required", "formula"}
        if bad:
            raise SpecError(
                name, "column declaration", f"column '{col}' has unknown keys {sorted(bad)}"
            )
        try:
            ctype = ColumnType(str(decl.get("type", "")).lower())
        except ValueError:
            raise SpecError(
                name,
                "column type",
                f"column '{col}' has type {decl.get('type')!r}; use one of "
                f"{[t.value for t in ColumnType]}",
            ) from None
        required = decl.get("required", False)
        if not isinstance(required, bool):
            raise SpecError(
                name, "column declaration", f"column '{col}': 'required' must be true or false"
            )
        out.append(ColumnSpec(str(col), ctype, required, _formula(name, str(col), decl)))
    return tuple(out)


def _formula(name: str, col: str, decl: Mapping[str, Any]) -> Formula | None:
    """The parsed formula of a computed column (None for an ingested column)."""
    if "formula" not in decl:
        return None
    text = decl["formula"]
    if not isinstance(text, str):
        raise SpecError(name, "formula", f"column '{col}': the formula must be text")
    if decl.get("required", False):
        raise SpecError(
            name,
            "formula",
            f"column '{col}' is computed; it cannot be required (a formula error stores null)",
        )
    try:
        return parse_formula(text)
    except FormulaSyntaxError as exc:
        raise SpecError(name, "formula", f"column '{col}': {exc}") from None


def _aggregation(name: str, index: int, a: Any) -> AggregationSpec:
    if not isinstance(a, Mapping) or not a.get("column") or not a.get("function"):
        raise SpecError(name, "aggregation", f"aggregation #{index} needs 'column' and 'function'")
    bad = set(a) - {"column", "function", "target"}
    if bad:
        raise SpecError(name, "aggregation", f"aggregation #{index} has unknown keys {sorted(bad)}")
    try:
        fn = AggregateFunction(str(a["function"]))
    except ValueError:
        raise SpecError(
            name,
            "aggregation function",
            f"aggregation #{index}: function {a['function']!r} is not one of "
            f"{[f.value for f in AggregateFunction]}",
        ) from None
    target = a.get("target")
    return AggregationSpec(str(a["column"]), fn, str(target) if target is not None else None)


def _retention(name: str, body: Mapping[str, Any]) -> timedelta | None:
    """`retention` of a raw or time-range archive or of a rollup; absent or null: rows are kept
    forever."""
    value = body.get("retention")
    return None if value is None else _duration(name, "retention", value)


def _duration(name: str, key: str, value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise SpecError(name, key, f"'{key}': {exc}") from None


def _origin(name: str, value: Any) -> datetime:
    """A FixedSize rollup's `origin`: an instant with its offset (`2024-01-01T06:00:00Z`), in
    UTC; absent: the Unix epoch. A local time (no offset) or a date is refused, as it could be
    read in UTC or in the reference zone."""
    if value is None:
        return EPOCH
    parsed = value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            parsed = None
    if isinstance(parsed, datetime) and parsed.tzinfo is not None:
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # an offset taking it before year 1 or past 9999
            pass
    raise SpecError(
        name,
        "origin",
        f"'origin' {value!r} is not an instant with its UTC offset in the years 1 to 9999 "
        "(e.g. 2024-01-01T06:00:00Z or 2024-01-01T00:00:00+01:00)",
    )


def _start(name: str, value: Any) -> datetime:
    if value is None:
        return datetime.min  # "inherit from the source rollup"; resolved during validation
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            raise SpecError(
                name, "start", "'start' is a local time in the reference zone; drop the offset"
            )
        return value
    if isinstance(value, date):
        return datetime(value.year, value.month, value.day)
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        raise SpecError(
            name, "start", f"'start' {value!r} is not an ISO date (YYYY-MM-DD)"
        ) from None
    if parsed.tzinfo is not None:
        raise SpecError(
            name, "start", "'start' is a local time in the reference zone; drop the offset"
        )
    return parsed
