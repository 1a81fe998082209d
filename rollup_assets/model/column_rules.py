"""The rules computed columns must pass at load, and the order they are computed in.

A computed column of a raw or time-range archive reads other columns of the same row: ingested
value columns, other computed columns, or the row's time key (`ts`, or `range_start` and
`range_end`). Each failure is a `SpecError` naming the archive and the column.
"""

import dataclasses
from enum import StrEnum
from typing import TypeVar

from rollup_assets.model.column_types import FORMULA_OPERAND_TYPES, FORMULA_RESULT_TYPES
from rollup_assets.model.errors import SpecError
from rollup_assets.model.specs import (
    ColumnSpec,
    RawArchiveSpec,
    SourceSpec,
    TimeRangeArchiveSpec,
    key_columns,
)

S = TypeVar("S", bound=RawArchiveSpec | TimeRangeArchiveSpec)


class ColumnAction(StrEnum):
    """A change of one computed column of an activated archive (`services.columns`)."""

    ADD = "add"
    SET_FORMULA = "set-formula"
    REMOVE = "remove"


def check_computed_columns(spec: S) -> S:
    """`spec`, its computed columns checked and ordered so that each follows those it reads."""
    computed = {c.name: c for c in spec.columns if c.formula is not None}
    if not computed:
        return spec
    times = set(key_columns(spec)[1:])
    for c in computed.values():
        _check_column(spec, c, times)
    order = _dependency_order(spec, computed)
    slots = iter(order)
    columns = tuple(computed[next(slots)] if c.is_computed else c for c in spec.columns)
    return dataclasses.replace(spec, columns=columns)


def _check_column(spec: SourceSpec, c: ColumnSpec, times: set[str]) -> None:
    assert c.formula is not None
    if c.type not in FORMULA_RESULT_TYPES:
        allowed = sorted(t.value for t in FORMULA_RESULT_TYPES)
        raise SpecError(
            spec.name,
            "formula result type",
            f"computed column '{c.name}' has type {c.type.value}; a formula gives one of {allowed}",
        )
    for name in sorted(c.formula.columns):
        if name == c.name:
            raise SpecError(
                spec.name, "formula", f"computed column '{c.name}' reads itself in its formula"
            )
        if name in times:
            continue
        ref = spec.column(name)
        if ref is None:
            known = sorted([*times, *(x.name for x in spec.columns if x.name != c.name)])
            raise SpecError(
                spec.name,
                "formula",
                f"computed column '{c.name}' reads '{name}', which is not a column of "
                f"'{spec.name}' (columns: {', '.join(known)})",
            )
        if ref.type not in FORMULA_OPERAND_TYPES:
            raise SpecError(
                spec.name,
                "formula",
                f"computed column '{c.name}' reads '{name}', a {ref.type.value} column; "
                "formulas read numbers, booleans and timestamps",
            )


def _dependency_order(spec: SourceSpec, computed: dict[str, ColumnSpec]) -> list[str]:
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, path: list[str]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            cycle = " -> ".join([*path[path.index(name) :], name])
            raise SpecError(spec.name, "formula", f"computed columns read each other: {cycle}")
        state[name] = "active"
        formula = computed[name].formula
        assert formula is not None
        for ref in sorted(formula.columns & computed.keys()):
            visit(ref, [*path, name])
        state[name] = "done"
        order.append(name)

    for name in computed:
        visit(name, [])
    return order


def stored_operands(spec: SourceSpec) -> frozenset[str]:
    """Optional ingested columns a computed column reads, directly or through another one.

    An upsert keeps the stored value of an optional column a batch leaves null, so these are
    the columns whose stored values a computed column of an upserted row may depend on.
    """
    out: set[str] = set()
    for c in spec.computed_columns:
        assert c.formula is not None
        for name in c.formula.columns:
            ref = spec.column(name)
            if ref is not None and not ref.is_computed and not ref.required:
                out.add(name)
    return frozenset(out)
