"""Declarative archive specs: frozen, typed models of raw, time-range and rollup archives.

Pure Python. `spec_loader` reads them and `spec_rules` validates them. A column's value type is
`column_types`'; what a rollup stores for its aggregations (partial columns, companions) is
`aggregates`'; what may name an archive, a tenant or a column is `names`'.
"""

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from rollup_assets.model.aggregates import (
    AggregateFunction,
    Companion,
    StoredColumn,
    companions_of,
    stored_columns_of,
)
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.errors import (
    ArchiveNotFoundError,
    InvalidArchiveOperationError,
    TenantError,
)
from rollup_assets.model.formulas import Formula
from rollup_assets.model.windows import EPOCH

# Columns the storage layer writes beside the declared value columns.
ENTITY_COLUMN = "entity_id"
TIME_COLUMN = "ts"
RANGE_START_COLUMN = "range_start"
RANGE_END_COLUMN = "range_end"
DAY_COLUMN = "day"


class Alignment(StrEnum):
    FIXED_SIZE = "FixedSize"
    CALENDAR_DAY = "CalendarDay"
    ISO8601_WEEK = "Iso8601Week"
    CALENDAR_MONTH = "CalendarMonth"
    CALENDAR_YEAR = "CalendarYear"


class ArchiveKind(StrEnum):
    RAW = "raw"
    TIME_RANGE = "time_range"
    ROLLUP = "rollup"


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
class AggregationSpec:
    column: str
    function: AggregateFunction
    target: str | None = None

    @property
    def output_name(self) -> str:
        return self.target or f"{self.column}_{self.function.value}".lower()

    def stored_columns(self, column_type: ColumnType) -> tuple[StoredColumn, ...]:
        """Its partial columns, for a source column of `column_type` (`stored_columns_of`)."""
        return stored_columns_of(self.column, self.function, self.output_name, column_type)


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
        return companions_of(((a.column, a.function) for a in self.aggregations), self.column_types)

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


def key_columns(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> list[str]:
    """The upsert key of a raw or time-range archive: entity, then its time column(s)."""
    if isinstance(spec, TimeRangeArchiveSpec):
        return [ENTITY_COLUMN, RANGE_START_COLUMN, RANGE_END_COLUMN]
    return [ENTITY_COLUMN, TIME_COLUMN]
