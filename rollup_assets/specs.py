"""Declarative archive specs: frozen, typed models and their validation.

Pure Python: no Spark, no Dagster, no I/O beyond reading the spec file. Every rule failure raises
`SpecError` naming the archive and the rule, so a bad spec never reaches the warehouse.
"""

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml

from rollup_assets.durations import parse_duration
from rollup_assets.errors import SpecError

ENTITY_COLUMN = "entity_id"
TIME_COLUMN = "ts"
RANGE_START_COLUMN = "range_start"
RANGE_END_COLUMN = "range_end"
DAY_COLUMN = "day"

# Columns the storage layer owns; a declared value column must not shadow them.
RESERVED_COLUMNS = frozenset(
    {
        ENTITY_COLUMN,
        TIME_COLUMN,
        RANGE_START_COLUMN,
        RANGE_END_COLUMN,
        DAY_COLUMN,
        "bucket_start",
        "bucket_end",
        "bucket_part",
        "generation",
        "run_id",
        "job_id",
        "source_versions",
    }
)
_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
DEFAULT_SPECS = Path(__file__).with_name("rollups.yaml")


class ColumnType(StrEnum):
    DOUBLE = "double"
    LONG = "long"
    BOOLEAN = "boolean"
    STRING = "string"

    @property
    def is_numeric(self) -> bool:
        return self in (ColumnType.DOUBLE, ColumnType.LONG)


class Alignment(StrEnum):
    FIXED_SIZE = "FixedSize"
    CALENDAR_DAY = "CalendarDay"
    ISO8601_WEEK = "Iso8601Week"
    CALENDAR_MONTH = "CalendarMonth"
    CALENDAR_YEAR = "CalendarYear"


class AggregateFunction(StrEnum):
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    COUNT = "Count"
    AVG = "Avg"


class ArchiveKind(StrEnum):
    RAW = "raw"
    TIME_RANGE = "time_range"
    ROLLUP = "rollup"


# The partial states an aggregation needs from its input, and the ones it stores.
# Avg is stored as sum + count so that chained rollups stay exact.
PARTIALS: dict[AggregateFunction, tuple[str, ...]] = {
    AggregateFunction.SUM: ("sum",),
    AggregateFunction.COUNT: ("count",),
    AggregateFunction.MIN: ("min",),
    AggregateFunction.MAX: ("max",),
    AggregateFunction.AVG: ("sum", "count"),
}


@dataclass(frozen=True)
class ColumnSpec:
    name: str
    type: ColumnType
    required: bool = False


@dataclass(frozen=True)
class StoredColumn:
    """A physical partial column of a rollup table: `name` holds `partial` of source `column`."""

    name: str
    column: str
    partial: str
    type: ColumnType


@dataclass(frozen=True)
class AggregationSpec:
    column: str
    function: AggregateFunction
    target: str | None = None

    @property
    def output_name(self) -> str:
        return self.target or f"{self.column}_{self.function.value}".lower()

    def stored_columns(self, column_type: ColumnType) -> tuple[StoredColumn, ...]:
        out = self.output_name
        if self.function is AggregateFunction.AVG:
            return (
                StoredColumn(f"{out}__sum", self.column, "sum", ColumnType.DOUBLE),
                StoredColumn(f"{out}__count", self.column, "count", ColumnType.LONG),
            )
        if self.function is AggregateFunction.COUNT:
            return (StoredColumn(out, self.column, "count", ColumnType.LONG),)
        return (StoredColumn(out, self.column, PARTIALS[self.function][0], column_type),)


@dataclass(frozen=True)
class RawArchiveSpec:
    name: str
    columns: tuple[ColumnSpec, ...]
    description: str = ""
    kind: ArchiveKind = field(default=ArchiveKind.RAW, init=False)

    @property
    def time_column(self) -> str:
        return TIME_COLUMN

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class TimeRangeArchiveSpec:
    """Externally pre-aggregated rows, each covering `[range_start, range_end)`."""

    name: str
    columns: tuple[ColumnSpec, ...]
    period: timedelta | None = None
    description: str = ""
    kind: ArchiveKind = field(default=ArchiveKind.TIME_RANGE, init=False)

    @property
    def time_column(self) -> str:
        return RANGE_START_COLUMN

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)


@dataclass(frozen=True)
class RollupSpec:
    name: str
    source: str
    alignment: Alignment
    reference_time_zone: str
    start: datetime  # naive local wall-clock time of the first partition, in the reference zone
    aggregations: tuple[AggregationSpec, ...]
    size: timedelta | None = None  # FixedSize only
    watermark_lag: timedelta = timedelta(0)
    refresh_open_bucket: bool = True
    description: str = ""
    # Filled in by validation: the value type of each aggregated source column.
    column_types: Mapping[str, ColumnType] = field(default_factory=dict, compare=False)
    kind: ArchiveKind = field(default=ArchiveKind.ROLLUP, init=False)

    @property
    def time_column(self) -> str:
        return "bucket_start"

    @property
    def genmap_name(self) -> str:
        return f"{self.name}__genmap"

    @property
    def stored_columns(self) -> tuple[StoredColumn, ...]:
        return tuple(
            sc
            for agg in self.aggregations
            for sc in agg.stored_columns(self.column_types.get(agg.column, ColumnType.DOUBLE))
        )

    @property
    def output_names(self) -> tuple[str, ...]:
        return tuple(a.output_name for a in self.aggregations)

    def partial_column(self, column: str, partial: str) -> str | None:
        """The stored column holding `partial` of source `column`, if this rollup keeps it."""
        return next(
            (
                sc.name
                for sc in self.stored_columns
                if sc.column == column and sc.partial == partial
            ),
            None,
        )

    def schema_fingerprint(self) -> str:
        aggs = ",".join(f"{a.column}:{a.function.value}:{a.output_name}" for a in self.aggregations)
        return (
            f"rollup|{self.source}|{self.alignment.value}|{self.size}|{self.reference_time_zone}"
            f"|{self.start.isoformat()}|{aggs}"
        )


ArchiveSpec = RawArchiveSpec | TimeRangeArchiveSpec | RollupSpec


def schema_fingerprint(spec: ArchiveSpec) -> str:
    """The schema-relevant part of a spec; an activated archive must keep it unchanged."""
    if isinstance(spec, RollupSpec):
        return spec.schema_fingerprint()
    cols = ",".join(f"{c.name}:{c.type.value}:{int(c.required)}" for c in spec.columns)
    period = getattr(spec, "period", None)
    return f"{spec.kind.value}|{cols}|{period}"


@dataclass(frozen=True)
class Catalog:
    """All declared archives, validated. Rollups are kept in dependency order (sources first)."""

    raw: Mapping[str, RawArchiveSpec]
    time_range: Mapping[str, TimeRangeArchiveSpec]
    rollups: Mapping[str, RollupSpec]
    origin: str = "<memory>"

    def archive(self, name: str) -> ArchiveSpec:
        for table in (self.raw, self.time_range, self.rollups):
            if name in table:
                return table[name]
        from rollup_assets.errors import ArchiveNotFoundError

        known = ", ".join(sorted(self.names())) or "none"
        raise ArchiveNotFoundError(
            f"archive '{name}' is not declared in {self.origin} (known: {known})"
        )

    def rollup(self, name: str) -> RollupSpec:
        spec = self.archive(name)
        if not isinstance(spec, RollupSpec):
            from rollup_assets.errors import InvalidArchiveOperationError

            raise InvalidArchiveOperationError(
                f"archive '{name}' is a {spec.kind.value} archive, not a rollup"
            )
        return spec

    def names(self) -> list[str]:
        return [*self.raw, *self.time_range, *self.rollups]

    def dependents(self, name: str) -> list[RollupSpec]:
        """Direct dependents of an archive, in dependency order."""
        return [r for r in self.rollups.values() if r.source == name]

    def base_source(self, name: str) -> ArchiveSpec:
        """The raw or time-range archive at the bottom of `name`'s chain."""
        spec = self.archive(name)
        while isinstance(spec, RollupSpec):
            spec = self.archive(spec.source)
        return spec

    def chain_root(self, name: str) -> RollupSpec:
        """The first rollup level of `name`'s chain (the one reading the base archive)."""
        spec = self.rollup(name)
        while spec.source in self.rollups:
            spec = self.rollups[spec.source]
        return spec

    def first_levels(self, base: str) -> list[RollupSpec]:
        return [r for r in self.rollups.values() if r.source == base]


# ---------------------------------------------------------------------------------------------
# Loading


def specs_path() -> Path:
    return Path(os.environ.get("ROLLUPS_SPECS") or DEFAULT_SPECS)


def load_catalog(path: str | os.PathLike[str] | None = None) -> Catalog:
    p = Path(path) if path is not None else specs_path()
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(str(p), "readable spec file", f"cannot read spec file: {exc}") from exc
    try:
        doc = yaml.load(text, Loader=_UniqueKeyLoader)  # a SafeLoader: no arbitrary objects
    except yaml.YAMLError as exc:
        raise SpecError(str(p), "valid YAML", f"not valid YAML: {exc}") from exc
    return parse_catalog(doc or {}, origin=str(p))


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that refuses a key given twice in one mapping (YAML requires unique keys;
    PyYAML would silently keep the last, dropping e.g. one of two rollups of the same name).
    Keys merged in with `<<:` may still be overridden."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag.endswith(":merge"):
                continue
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping",
                    node.start_mark,
                    f"found duplicate key {key!r}",
                    key_node.start_mark,
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def parse_catalog(doc: Mapping[str, Any], origin: str = "<memory>") -> Catalog:
    from rollup_assets.spec_rules import validate_catalog

    if not isinstance(doc, Mapping):
        raise SpecError(origin, "top-level mapping", "the spec file must be a mapping")
    unknown = {k for k in doc if not str(k).startswith("x-")} - {
        "raw_archives",
        "time_range_archives",
        "rollups",
    }
    if unknown:
        raise SpecError(
            origin,
            "known top-level keys",
            f"unknown top-level keys {sorted(unknown)}; expected raw_archives, "
            "time_range_archives, rollups",
        )
    raw = {n: _parse_raw(n, b) for n, b in _section(doc, "raw_archives", origin).items()}
    tr = {
        n: _parse_time_range(n, b) for n, b in _section(doc, "time_range_archives", origin).items()
    }
    rollups = {n: _parse_rollup(n, b) for n, b in _section(doc, "rollups", origin).items()}
    return validate_catalog(raw, tr, rollups, origin)


def _section(doc: Mapping[str, Any], key: str, origin: str) -> dict[str, Any]:
    value = doc.get(key) or {}
    if not isinstance(value, Mapping):
        raise SpecError(origin, f"{key} is a mapping", f"'{key}' must map archive names to specs")
    return {str(k): v for k, v in value.items()}


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
        bad = set(decl) - {"type", "required"}
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
        out.append(ColumnSpec(str(col), ctype, required))
    return tuple(out)


def _parse_raw(name: str, body: Any) -> RawArchiveSpec:
    b = _mapping(name, body, {"columns", "description"})
    return RawArchiveSpec(
        name=name, columns=_columns(name, b), description=str(b.get("description", ""))
    )


def _parse_time_range(name: str, body: Any) -> TimeRangeArchiveSpec:
    b = _mapping(name, body, {"columns", "description", "period"})
    period = _duration(name, "period", b.get("period")) if b.get("period") is not None else None
    return TimeRangeArchiveSpec(
        name=name,
        columns=_columns(name, b),
        period=period,
        description=str(b.get("description", "")),
    )


_ROLLUP_KEYS = {
    "source",
    "alignment",
    "size",
    "reference_time_zone",
    "watermark_lag",
    "refresh_open_bucket",
    "start",
    "aggregations",
    "description",
}


def _parse_rollup(name: str, body: Any) -> RollupSpec:
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
        reference_time_zone=str(b.get("reference_time_zone", "UTC")),
        watermark_lag=_duration(name, "watermark_lag", b.get("watermark_lag", "0s")),
        refresh_open_bucket=refresh,
        start=_start(name, b.get("start")),
        aggregations=aggs,
        description=str(b.get("description", "")),
    )


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


def _duration(name: str, key: str, value: Any) -> timedelta:
    try:
        return parse_duration(value)
    except ValueError as exc:
        raise SpecError(name, key, f"'{key}': {exc}") from None


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


def is_valid_name(name: str) -> bool:
    return bool(_NAME.match(name)) and "__" not in name
