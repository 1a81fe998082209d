"""The aggregate functions a rollup applies, and what a rollup table stores for them: each
function's partial states (`PARTIALS`), the partial columns holding them (`StoredColumn`) and the
companions kept beside them (`Companion`), from which a change of source values is applied as a
difference.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum

from rollup_assets.model.column_types import ColumnType


class AggregateFunction(StrEnum):
    SUM = "Sum"
    MIN = "Min"
    MAX = "Max"
    COUNT = "Count"
    AVG = "Avg"


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
class StoredColumn:
    """A physical partial column of a rollup table: `name` holds `partial` of source `column`."""

    name: str
    column: str
    partial: str
    type: ColumnType


def stored_columns_of(
    column: str, function: AggregateFunction, output_name: str, column_type: ColumnType
) -> tuple[StoredColumn, ...]:
    """The partial columns of an aggregation (`function` of source `column`, of `column_type`)
    named `output_name`: an average keeps a sum and a count."""
    if function is AggregateFunction.AVG:
        return (
            StoredColumn(f"{output_name}__sum", column, "sum", ColumnType.DOUBLE),
            StoredColumn(f"{output_name}__count", column, "count", ColumnType.LONG),
        )
    if function is AggregateFunction.COUNT:
        return (StoredColumn(output_name, column, "count", ColumnType.LONG),)
    if function is AggregateFunction.SUM:
        return (StoredColumn(output_name, column, "sum", column_type.sum_type),)
    return (StoredColumn(output_name, column, PARTIALS[function][0], column_type),)


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
    aggregations: Iterable[tuple[str, AggregateFunction]], column_types: Mapping[str, ColumnType]
) -> tuple[Companion, ...]:
    """The companion columns a rollup keeps, per aggregated column, for its `aggregations` given
    as (source column, function) pairs."""
    functions: dict[str, set[AggregateFunction]] = {}
    for column, function in aggregations:
        functions.setdefault(column, set()).add(function)
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
