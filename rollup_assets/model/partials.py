"""The partial algebra: what a rollup stores per cell, how partials merge, and how a change of
source values is applied to them as a difference, without the values it did not change.

Every aggregation decomposes over the raw values of its cell:

  * a sum keeps the sum of its finite values, how many values are not null, and how many are
    NaN, +infinity and -infinity: the sum a reader sees (SQL's, and Spark's: NaN when a NaN or
    both infinities are in, an infinity when one is) follows from those, and a change is a
    difference of each (`SumState`). Avg is such a sum read over its count; Count is the
    number of values that are not null;
  * a minimum (a maximum alike) keeps a *prefix*: the k smallest values (repeats counted, NaN
    above every number, as Spark orders them), and how many values there are. Its value is
    the prefix's first; a value leaving the cell leaves the prefix too, a value entering it
    enters the prefix when it ranks inside what is known. The prefix stays exact, only
    shorter, until every value of it left while others remain: the cell is then *exhausted*
    and must be aggregated again from its source (`ExtremeState.exhausted`). A prefix holding
    every value of its cell (`complete`) never exhausts.

A difference (a change of some source rows: the values leaving the cell and those entering it)
applies the same way at every level of a chain: a value of a raw row is a value of exactly one
cell at each level. Merging the states of several cells (a bucket above from the buckets below)
is exact too: the merged prefix keeps the values below the smallest end of an incomplete prefix.

A rollup's rows are declared here, as names and model types (`row_columns`): the cell, its
partials (`RollupSpec.stored_columns`), the count of its source rows, the companions of each
aggregated column (`RollupSpec.companions`: a base row's state, a difference row's values
entering and leaving), and what each row says of its kind and of the run that wrote it. The
Arrow schema of the tables (`resources.schemas`) and every transform that writes or reads these
columns (`compute`) derive from it.

Pure Python, the reference every vectorized reading (Arrow, Spark) is checked against.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollup_assets.model.aggregates import BASE_KINDS
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec

# How many extreme values a minimum or maximum keeps per cell. A bucket of a handful of source
# rows keeps them all (a 15-minute reading's hour keeps 4); a larger bucket exhausts only when
# this many of its smallest values leave before maintenance folds it again from its source.
SPARES = 8

# The cell a row is of: the entity and its bucket (UTC instants, end exclusive).
CELL_COLUMNS = (ENTITY_COLUMN, "bucket_start", "bucket_end")
# A base row: how many source rows its cell holds (a cell whose rows all left has no row).
RAW_ROWS = "raw_rows"
# The generation a row was written at: the pointers name which one a read sees.
GENERATION = "generation"
# What a row says of the run that wrote it.
WRITTEN_BY = ("run_id", "job_id", "source_versions")
# A difference row (the values entering and leaving its cell) rather than a cell's state.
DELTA_COLUMN = "delta"

# How each kind of base companion merges (cells below into the bucket above, a difference into
# its cell): the spare extremes of a minimum (`lo`) and of a maximum (`hi`: the largest values,
# True here) as an `ExtremeState`; every other kind (`SumState`'s) adds up.
EXTREMES: dict[str, bool] = {"lo": False, "hi": True}
ADDED_KINDS = BASE_KINDS - EXTREMES.keys()
# The special values a sum counts apart from its finite total (`SumState`'s fields).
SPECIAL_KINDS = ("nan", "pinf", "ninf")


@dataclass(frozen=True)
class RowColumn:
    """A column of a rollup's rows: its name, its type, and whether it holds a list of them."""

    name: str
    type: ColumnType
    listed: bool = False


def state_columns(spec: RollupSpec) -> tuple[RowColumn, ...]:
    """What a base row holds of its cell's state: the partials, how many source rows the cell
    holds, and the companions a difference applies to (`BASE_KINDS`), in table order."""
    partials = [RowColumn(sc.name, sc.type) for sc in spec.stored_columns]
    companions = [
        RowColumn(c.name, c.type, c.listed) for c in spec.companions if c.kind in BASE_KINDS
    ]
    return (*partials, RowColumn(RAW_ROWS, ColumnType.LONG), *companions)


def row_columns(spec: RollupSpec) -> tuple[RowColumn, ...]:
    """Every column of `spec`'s rows, in table order: the cell, the partials, how many source
    rows the cell holds, every companion (a difference row's values entering and leaving its
    cell among them), the generation, the run that wrote the row, and its kind."""
    cell = (ColumnType.STRING, ColumnType.TIMESTAMP, ColumnType.TIMESTAMP)
    return (
        *(RowColumn(name, t) for name, t in zip(CELL_COLUMNS, cell, strict=True)),
        *(RowColumn(sc.name, sc.type) for sc in spec.stored_columns),
        RowColumn(RAW_ROWS, ColumnType.LONG),
        *(RowColumn(c.name, c.type, c.listed) for c in spec.companions),
        RowColumn(GENERATION, ColumnType.LONG),
        *(RowColumn(name, ColumnType.STRING) for name in WRITTEN_BY),
        RowColumn(DELTA_COLUMN, ColumnType.BOOLEAN),
    )


def is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _key(v: Any) -> tuple[int, Any]:
    """Spark's order: NaN above every number."""
    return (1, 0.0) if is_nan(v) else (0, v)


def _same(a: Any, b: Any) -> bool:
    return (is_nan(a) and is_nan(b)) or a == b


@dataclass(frozen=True)
class SumState:
    """A sum's partial: the sum of the finite values, the values that are not null, and the
    NaN and infinite ones. `exact_ints` sums (an int or long column) carry no special values."""

    total: float | int = 0
    n: int = 0
    nan: int = 0
    pinf: int = 0
    ninf: int = 0

    @classmethod
    def of(cls, values: Iterable[Any]) -> "SumState":
        total: float | int = 0
        n = nan = pinf = ninf = 0
        finite: list[float] = []
        for v in values:
            if v is None:
                continue
            n += 1
            if is_nan(v):
                nan += 1
            elif v == math.inf:
                pinf += 1
            elif v == -math.inf:
                ninf += 1
            else:
                finite.append(v)
        if finite and any(isinstance(v, float) for v in finite):
            try:
                total = math.fsum(finite)
            except OverflowError:  # finite values whose sum is not: `overflowed`
                total = math.inf
        elif finite:
            total = sum(finite)
        return cls(total, n, nan, pinf, ninf)

    def plus(self, other: "SumState", sign: int = 1) -> "SumState":
        return SumState(
            self.total + sign * other.total,
            self.n + sign * other.n,
            self.nan + sign * other.nan,
            self.pinf + sign * other.pinf,
            self.ninf + sign * other.ninf,
        )

    @property
    def overflowed(self) -> bool:
        """A finite total that no longer is (its finite values overflowed): differences can no
        longer be taken from it exactly."""
        return isinstance(self.total, float) and not math.isfinite(self.total)

    @property
    def value(self) -> float | int | None:
        """What SQL's SUM gives: null without values, NaN with a NaN or both infinities."""
        if self.n == 0:
            return None
        if self.nan or (self.pinf and self.ninf):
            return math.nan
        if self.pinf:
            return math.inf
        if self.ninf:
            return -math.inf
        return self.total


@dataclass(frozen=True)
class ExtremeState:
    """A minimum's (`largest` False) or maximum's (`largest` True) partial: the prefix of the
    cell's values in that order (at most `SPARES` of them) and how many values there are."""

    largest: bool = False
    prefix: tuple[Any, ...] = ()
    n: int = 0

    def _ordered(self, values: Iterable[Any]) -> list[Any]:
        return sorted(values, key=_key, reverse=self.largest)

    @classmethod
    def of(cls, values: Iterable[Any], largest: bool = False, k: int = SPARES) -> "ExtremeState":
        present = [v for v in values if v is not None]
        state = cls(largest, (), len(present))
        return cls(largest, tuple(state._ordered(present)[:k]), len(present))

    @property
    def complete(self) -> bool:
        return len(self.prefix) == self.n

    @property
    def exhausted(self) -> bool:
        """Values remain but none of them is known: the cell must be aggregated again."""
        return self.n > 0 and not self.prefix

    @property
    def value(self) -> Any:
        if self.n == 0:
            return None
        if not self.prefix:
            raise ValueError("an exhausted extreme has no known value")
        return self.prefix[0]

    def _inside(self, prefix: list[Any], v: Any) -> bool:
        """Does `v` rank at or before the last value of `prefix` (not empty)?"""
        last = _key(prefix[-1])
        return _key(v) >= last if self.largest else _key(v) <= last

    def apply(
        self, entering: Sequence[Any], leaving: Sequence[Any], k: int = SPARES
    ) -> "ExtremeState":
        """This state after `entering` values joined the cell and `leaving` ones left it (the
        values entering first, so an update's new value can stand in for its old one)."""
        prefix = list(self.prefix)
        n = self.n
        joining = [x for x in entering if x is not None]
        # A complete prefix takes every value; an incomplete one those ranking inside it (every
        # unknown value ranks after its last, which what joins never moves). One stable sort
        # places them as inserting them one by one would.
        if len(prefix) == n:
            admitted = joining
        else:
            admitted = [v for v in joining if prefix and self._inside(prefix, v)]
        if admitted:
            prefix = self._ordered([*prefix, *admitted])
        n += len(joining)
        for v in (x for x in leaving if x is not None):
            if len(prefix) == n or (prefix and self._inside(prefix, v)):
                at = next((i for i, p in enumerate(prefix) if _same(p, v)), None)
                if at is None:
                    # A value said to leave that the prefix should hold: what is known no longer
                    # matches the source; only an aggregation from the source is exact now.
                    return ExtremeState(self.largest, (), max(n - 1, 1))
                del prefix[at]
            n -= 1
        return ExtremeState(self.largest, tuple(prefix[:k]), n)

    @classmethod
    def merge(
        cls, states: Sequence["ExtremeState"], largest: bool = False, k: int = SPARES
    ) -> "ExtremeState":
        """The state of the union of cells whose states are `states`: the values known up to
        the first end of an incomplete prefix (every value beyond it ranks after it)."""
        n = sum(s.n for s in states)
        incomplete = [s for s in states if not s.complete]
        if any(not s.prefix for s in incomplete):
            return cls(largest, (), n)  # an exhausted part: nothing of the union is known
        known = [v for s in states for v in s.prefix]
        if incomplete:
            ends = [_key(s.prefix[-1]) for s in incomplete]
            if largest:
                bound = max(ends)
                known = [v for v in known if _key(v) >= bound]
            else:
                bound = min(ends)
                known = [v for v in known if _key(v) <= bound]
        ordered = sorted(known, key=_key, reverse=largest)
        return cls(largest, tuple(ordered[:k]), n)


@dataclass(frozen=True)
class Difference:
    """A change of one cell's values of one column: those leaving it (a deleted row's, an
    updated row's old value) and those entering it (an inserted row's, an updated row's new)."""

    entering: tuple[Any, ...] = ()
    leaving: tuple[Any, ...] = ()

    def sum(self) -> SumState:
        return SumState.of(self.entering).plus(SumState.of(self.leaving), sign=-1)


@dataclass
class CellValues:
    """A cell's values of one column, for tests and small folds: the reference aggregation."""

    values: list[Any] = field(default_factory=list)

    def sum(self) -> SumState:
        return SumState.of(self.values)

    def extreme(self, largest: bool, k: int = SPARES) -> ExtremeState:
        return ExtremeState.of(self.values, largest, k)
