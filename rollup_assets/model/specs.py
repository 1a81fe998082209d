"""Declarative archive specs: frozen, typed models of raw, time-range and rollup archives.

Pure Python. `spec_loader` reads them from YAML and `spec_rules` validates them.
"""

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from rollup_assets.model.errors import (
    ArchiveNotFoundError,
    InvalidArchiveOperationError,
    TenantError,
)
from rollup_assets.model.formulas import FUNCTIONS, KEYWORDS, Formula
from rollup_assets.model.windows import EPOCH

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
        "delta",
        "raw_rows",
    }
)
# Words a column must not be named: a formula would read them as its literals (`true`,
# `false`), operators or functions, and SQL (the query engine's filters and casts) reads `null`
# as its literal, so a column of that name fails every ingest without naming itself.
RESERVED_WORDS = frozenset({"null"}) | KEYWORDS | FUNCTIONS
# The name rule (`name_problem`), matched whole: `re.match` with `$` would accept a trailing
# newline ("meter\n"), which then fails deep inside the query engine instead of at load.
_NAME = re.compile(r"[a-z][a-z0-9_]{0,62}")
# C0 and C1 control characters (NUL, tab, newline, DEL, ...): part of no name and no entity id.
# Python `re` and RE2 (Arrow's `match_substring_regex`) read this pattern alike.
CONTROL_CHARACTERS = r"[\x00-\x1f\x7f-\x9f]"


class ColumnType(StrEnum):
    DOUBLE = "double"
    LONG = "long"  # 64-bit
    INT = "int"  # 32-bit
    BOOLEAN = "boolean"
    STRING = "string"
    TIMESTAMP = "timestamp"  # an instant, microseconds, UTC

    @property
    def is_numeric(self) -> bool:
        return self in (ColumnType.DOUBLE, ColumnType.LONG, ColumnType.INT)

    @property
    def sum_type(self) -> "ColumnType":
        """The type a sum of this column is stored as (an int sum would overflow 32 bits)."""
        return ColumnType.LONG if self is ColumnType.INT else self


# The result types a computed column may have, and the column types a formula may read.
FORMULA_RESULT_TYPES = frozenset(
    {ColumnType.BOOLEAN, ColumnType.INT, ColumnType.LONG, ColumnType.DOUBLE, ColumnType.TIMESTAMP}
)
FORMULA_OPERAND_TYPES = FORMULA_RESULT_TYPES


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
    """A value column: ingested from the producer's batch, or computed by `formula`."""

    name: str
    type: ColumnType
    required: bool = False
    formula: Formula | None = None

    @property
    def is_computed(self) -> bool:
        return self.formula is not None


@dataclass(frozen=True)
class StoredColumn:
    """A physical partial column of a rollup table: `name` holds `partial` of source `column`."""

    name: str
    column: str
    partial: str
    type: ColumnType


# What a rollup keeps of each source column next to its partials, so that a change of source
# values can be applied as a difference (`model.partials`): the values that are not null; the
# sum of the finite ones and the NaN and infinite ones (a sum or average); the smallest and
# largest values (a minimum, a maximum). A difference row holds the values entering and leaving
# its cell instead.
COMPANION_KINDS = ("n", "total", "nan", "pinf", "ninf", "lo", "hi", "in", "out")
# The companions of a base row (a cell's state) and of a difference row (a change of it).
BASE_KINDS = frozenset({"n", "total", "nan", "pinf", "ninf", "lo", "hi"})
DELTA_KINDS = frozenset({"in", "out"})


@dataclass(frozen=True)
class Companion:
    """A hidden column of a rollup table: `kind` (one of `COMPANION_KINDS`) of source `column`;
    `listed`: a list of `type` values."""

    name: str
    column: str
    kind: str
    type: ColumnType
    listed: bool = False


def companions_of(
    aggregations: "tuple[AggregationSpec, ...]", column_types: Mapping[str, ColumnType]
) -> tuple[Companion, ...]:
    """The companion columns a rollup with `aggregations` keeps, per aggregated column."""
    functions: dict[str, set[AggregateFunction]] = {}
    for agg in aggregations:
        functions.setdefault(agg.column, set()).add(agg.function)
    out: list[Companion] = []
    for column, fns in functions.items():
        t = column_types.get(column, ColumnType.DOUBLE)
        out.append(Companion(f"{column}__n", column, "n", ColumnType.LONG))
        if fns & {AggregateFunction.SUM, AggregateFunction.AVG}:
            out.append(Companion(f"{column}__total", column, "total", t.sum_type))
            if t is ColumnType.DOUBLE:
                out += [
                    Companion(f"{column}__{k}", column, k, ColumnType.LONG)
                    for k in ("nan", "pinf", "ninf")
                ]
        if AggregateFunction.MIN in fns:
            out.append(Companion(f"{column}__lo", column, "lo", t, listed=True))
        if AggregateFunction.MAX in fns:
            out.append(Companion(f"{column}__hi", column, "hi", t, listed=True))
        out += [Companion(f"{column}__{k}", column, k, t, listed=True) for k in ("in", "out")]
    return tuple(out)


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
        if self.function is AggregateFunction.SUM:
            return (StoredColumn(out, self.column, "sum", column_type.sum_type),)
        return (StoredColumn(out, self.column, PARTIALS[self.function][0], column_type),)


@dataclass(frozen=True)
class RawArchiveSpec:
    name: str
    columns: tuple[ColumnSpec, ...]
    description: str = ""
    # How long raw rows are kept (whole UTC days older than it are dropped); None: forever.
    # Not part of the schema fingerprint: it may change while the archive is activated.
    retention: timedelta | None = None
    kind: ArchiveKind = field(default=ArchiveKind.RAW, init=False)

    @property
    def time_column(self) -> str:
        return TIME_COLUMN

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)

    @property
    def computed_columns(self) -> tuple[ColumnSpec, ...]:
        """Computed columns, each after the computed columns its formula reads."""
        return tuple(c for c in self.columns if c.is_computed)


@dataclass(frozen=True)
class TimeRangeArchiveSpec:
    """Externally pre-aggregated rows, each covering `[range_start, range_end)`.

    A row belongs to the bucket holding its `range_start`, and its whole range must lie in that
    bucket of every first-level rollup over the archive (ingest refuses a row a bucket would
    split). `period` is the declared length of a row's range: a rollup over the archive must
    have buckets that are whole multiples of it (checked at load).
    """

    name: str
    columns: tuple[ColumnSpec, ...]
    period: timedelta | None = None
    description: str = ""
    retention: timedelta | None = None  # as for raw archives (by `range_start`)
    # Filled in by validation: the rollups built directly from this archive, whose buckets
    # every ingested row's range must lie within.
    first_levels: tuple["RollupSpec", ...] = field(default=(), compare=False, repr=False)
    kind: ArchiveKind = field(default=ArchiveKind.TIME_RANGE, init=False)

    @property
    def time_column(self) -> str:
        return RANGE_START_COLUMN

    def column(self, name: str) -> ColumnSpec | None:
        return next((c for c in self.columns if c.name == name), None)

    @property
    def computed_columns(self) -> tuple[ColumnSpec, ...]:
        """Computed columns, each after the computed columns its formula reads."""
        return tuple(c for c in self.columns if c.is_computed)


@dataclass(frozen=True)
class RollupSpec:
    name: str
    source: str
    alignment: Alignment
    reference_time_zone: str
    start: datetime  # naive local wall-clock time of the first partition, in the reference zone
    aggregations: tuple[AggregationSpec, ...]
    size: timedelta | None = None  # FixedSize only: a whole number of minutes
    # FixedSize only: the UTC instant buckets are counted from, bucket k being
    # [origin + k * size, origin + (k + 1) * size).
    origin: datetime = EPOCH
    watermark_lag: timedelta = timedelta(0)
    refresh_open_bucket: bool = True
    description: str = ""
    # How long the rollup's buckets are kept (buckets older than it are dropped, once every
    # rollup reading this one has aggregated them); None: forever. Not part of the schema
    # fingerprint: it may change while the rollup is activated.
    retention: timedelta | None = None
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
    def companions(self) -> tuple[Companion, ...]:
        """The hidden columns kept next to the partials (`companions_of`)."""
        return companions_of(self.aggregations, self.column_types)

    @property
    def aggregated_columns(self) -> tuple[str, ...]:
        """The source columns aggregated, each once, in declaration order."""
        return tuple(dict.fromkeys(a.column for a in self.aggregations))

    def companion(self, column: str, kind: str) -> str | None:
        """The name of `column`'s companion of `kind`, if this rollup keeps one."""
        return next(
            (c.name for c in self.companions if c.column == column and c.kind == kind), None
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
        # The default origin adds nothing: fingerprints recorded before origins existed still match.
        origin = "" if self.origin == EPOCH else f"@{self.origin.isoformat()}"
        return (
            f"rollup|{self.source}|{self.alignment.value}|{self.size}{origin}"
            f"|{self.reference_time_zone}|{self.start.isoformat()}|{aggs}"
        )


ArchiveSpec = RawArchiveSpec | TimeRangeArchiveSpec | RollupSpec
# An archive readings are written to, that rollups aggregate from: raw or time-range.
SourceSpec = RawArchiveSpec | TimeRangeArchiveSpec


def schema_fingerprint(spec: ArchiveSpec) -> str:
    """The schema-relevant part of a spec; an activated archive must keep it unchanged.

    An archive's `retention` (raw, time-range or rollup) is not in it: retention decides how
    long rows are kept, not what a row is, so it may be changed (shortened or lengthened) on an
    activated archive."""
    if isinstance(spec, RollupSpec):
        return spec.schema_fingerprint()
    # Computed columns are not frozen: the table records the formulas it applies, and a changed
    # declaration is a pending change applied online (`services/columns.py`).
    cols = ",".join(
        f"{c.name}:{c.type.value}:{int(c.required)}" for c in spec.columns if not c.is_computed
    )
    period = getattr(spec, "period", None)
    return f"{spec.kind.value}|{cols}|{period}"


@dataclass(frozen=True)
class Tenant:
    """A tenant: every declared archive again, in its own warehouse root and under its own
    asset-key prefix. `warehouse` is the root the spec gives (None: the default, a directory
    named after the tenant under the configured warehouse, resolved at the edge)."""

    name: str
    warehouse: str | None = None


@dataclass(frozen=True)
class Catalog:
    """All declared archives, validated. Rollups are kept in dependency order (sources first).
    With `tenants`, each tenant gets every archive, in isolation; without, there is one
    installation, as before."""

    raw: Mapping[str, RawArchiveSpec]
    time_range: Mapping[str, TimeRangeArchiveSpec]
    rollups: Mapping[str, RollupSpec]
    origin: str = "<memory>"
    tenants: Mapping[str, Tenant] = field(default_factory=dict)

    def tenant(self, name: str | None) -> Tenant | None:
        """The tenant a command acts for: `name` must be a declared tenant when the spec
        declares tenants, and None when it declares none."""
        known = ", ".join(self.tenants)
        if name is None:
            if self.tenants:
                raise TenantError(f"{self.origin} declares tenants ({known}); name one of them")
            return None
        if not self.tenants:
            raise TenantError(f"tenant '{name}' given, but {self.origin} declares no tenants")
        if name not in self.tenants:
            raise TenantError(f"tenant '{name}' is not declared in {self.origin} (known: {known})")
        return self.tenants[name]

    def archive(self, name: str) -> ArchiveSpec:
        for table in (self.raw, self.time_range, self.rollups):
            if name in table:
                return table[name]
        known = ", ".join(sorted(self.names())) or "none"
        raise ArchiveNotFoundError(
            f"archive '{name}' is not declared in {self.origin} (known: {known})"
        )

    def rollup(self, name: str) -> RollupSpec:
        spec = self.archive(name)
        if not isinstance(spec, RollupSpec):
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

    def first_levels(self, base: str) -> list[RollupSpec]:
        return [r for r in self.rollups.values() if r.source == base]


def name_problem(name: object) -> str | None:
    """Why `name` cannot name an archive, a tenant or a column (None when it can): a name is a
    lower-case identifier (a-z, 0-9, _; no '__') of at most 63 characters. The name is shown
    with `repr`, so a control character in it is visible in a one-line message."""
    if not isinstance(name, str):
        return f"{name!r} is not text"
    if re.search(CONTROL_CHARACTERS, name):
        return f"{name!r} holds a control character"
    if _NAME.fullmatch(name) is None or "__" in name:
        return (
            f"{name!r} is not a lower-case identifier (a-z, 0-9, _; no '__') of at most 63 "
            "characters"
        )
    return None


def column_name_problem(name: object) -> str | None:
    """Why `name` cannot name a value column or an aggregation's target (None when it can): the
    name rule, not a column the storage layer owns, and not a reserved word."""
    problem = name_problem(name)
    if problem is None and name in RESERVED_COLUMNS:
        problem = f"{name!r} is reserved by the storage layer"
    if problem is None and name in RESERVED_WORDS:
        problem = (
            f"{name!r} is a reserved word (a literal, operator or function of formulas and "
            "SQL); choose another name"
        )
    return problem


def key_columns(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> list[str]:
    """The upsert key of a raw or time-range archive: entity, then its time column(s)."""
    if isinstance(spec, TimeRangeArchiveSpec):
        return [ENTITY_COLUMN, RANGE_START_COLUMN, RANGE_END_COLUMN]
    return [ENTITY_COLUMN, TIME_COLUMN]
