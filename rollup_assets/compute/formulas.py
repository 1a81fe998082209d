"""Evaluating computed columns over a batch with Arrow compute: no Python per row, no `eval`.

The semantics (see `model/formulas.py` for the grammar): every operand is a float64 number
(a boolean is 1 or 0, a timestamp its milliseconds since the epoch); any operation whose result
is NaN or infinite (0/0, x/0, sqrt(-1), ln(0), an overflow) gives null, and a null operand gives
null, so a formula never fails a batch: the cell stores null. The number is then stored as the
column's type: a boolean is "not 0", an int or long is truncated toward zero (null outside the
type's range), a timestamp reads the number as milliseconds since 1970-01-01 UTC (null outside
years 1 to 9999).
"""

from collections.abc import Mapping
from typing import TypeAlias

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.formulas import Binary, Call, ColumnRef, Formula, Node, Number, Unary

Values: TypeAlias = pa.ChunkedArray | pa.Array | pa.Scalar

_US_PER_MS = 1_000
# Inclusive bounds of each integer result, as floats a truncated value is compared with.
_INT_RANGES = {
    ColumnType.INT: (-(2.0**31), 2.0**31 - 1),
    ColumnType.LONG: (-(2.0**63), 2.0**63 - 1024),  # the largest double below 2**63
}
# Milliseconds of 0001-01-01 and 9999-12-31T23:59:59.999 UTC.
_TS_RANGE_MS = (-62_135_596_800_000.0, 253_402_300_799_999.0)

_ARITHMETIC = {"+": pc.add, "-": pc.subtract, "*": pc.multiply, "/": pc.divide, "^": pc.power}
_COMPARE = {
    "<": pc.less,
    "<=": pc.less_equal,
    ">": pc.greater,
    ">=": pc.greater_equal,
    "==": pc.equal,
    "!=": pc.not_equal,
}
_UNARY = {
    "abs": pc.abs,
    "sqrt": pc.sqrt,
    "exp": pc.exp,
    "ln": pc.ln,
    "log10": pc.log10,
    "floor": pc.floor,
    "ceil": pc.ceil,
    "sign": pc.sign,
}


def evaluate(
    formula: Formula, columns: Mapping[str, pa.ChunkedArray | pa.Array], rows: int
) -> pa.ChunkedArray | pa.Array:
    """`formula` over `columns` (every column it reads), as float64 numbers or nulls."""
    out = _eval(formula.tree, columns)
    if isinstance(out, pa.Scalar):
        return pa.array([out.as_py()] * rows, pa.float64())
    return out


def computed_values(
    formula: Formula,
    ctype: ColumnType,
    columns: Mapping[str, pa.ChunkedArray | pa.Array],
    rows: int,
    arrow_type: pa.DataType,
) -> pa.ChunkedArray | pa.Array:
    """The values of a computed column of type `ctype`, stored as `arrow_type`."""
    return as_column_type(evaluate(formula, columns, rows), ctype, arrow_type)


def as_column_type(
    x: pa.ChunkedArray | pa.Array, ctype: ColumnType, arrow_type: pa.DataType
) -> pa.ChunkedArray | pa.Array:
    if ctype is ColumnType.DOUBLE:
        return x
    if ctype is ColumnType.BOOLEAN:
        return pc.not_equal(x, 0.0)
    if ctype in _INT_RANGES:
        lo, hi = _INT_RANGES[ctype]
        t = pc.trunc(x)
        inside = pc.and_(pc.greater_equal(t, lo), pc.less_equal(t, hi))
        return pc.cast(pc.if_else(inside, t, None), arrow_type)
    if ctype is ColumnType.TIMESTAMP:
        lo, hi = _TS_RANGE_MS
        t = pc.trunc(pc.multiply(x, float(_US_PER_MS)))
        inside = pc.and_(pc.greater_equal(x, lo), pc.less_equal(x, hi))
        micros = pc.cast(pc.if_else(inside, t, None), pa.int64())
        return pc.cast(micros, arrow_type)
    raise ValueError(f"a formula cannot produce a {ctype.value} column")


def as_number(values: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A column as float64 numbers: booleans 1/0, timestamps in milliseconds since the epoch."""
    t = values.type
    if pa.types.is_timestamp(t):
        micros = pc.cast(pc.cast(values, pa.timestamp("us", tz=t.tz)), pa.int64())
        return pc.divide(pc.cast(micros, pa.float64()), float(_US_PER_MS))
    return pc.cast(values, pa.float64())


def _finite(x: Values) -> Values:
    """`x` with NaN and infinities made null."""
    if isinstance(x, pa.Scalar):
        v = x.as_py()
        ok = v is not None and v == v and v not in (float("inf"), float("-inf"))
        return x if ok else pa.scalar(None, pa.float64())
    return pc.if_else(pc.is_finite(x), x, None)


def _truth(x: Values) -> Values:
    return pc.not_equal(x, 0.0)


def _number(x: Values) -> Values:
    return pc.cast(x, pa.float64())


def _eval(node: Node, columns: Mapping[str, pa.ChunkedArray | pa.Array]) -> Values:
    match node:
        case Number(value):
            return pa.scalar(value, pa.float64())
        case ColumnRef(name):
            return as_number(columns[name])
        case Unary("-", operand):
            return pc.negate(_eval(operand, columns))
        case Unary(_, operand):  # not
            return _number(pc.invert(_truth(_eval(operand, columns))))
        case Binary(op, left, right):
            a, b = _eval(left, columns), _eval(right, columns)
            if op in _ARITHMETIC:
                return _finite(_ARITHMETIC[op](a, b))
            if op in _COMPARE:
                return _number(_COMPARE[op](a, b))
            combine = pc.and_ if op == "and" else pc.or_
            return _number(combine(_truth(a), _truth(b)))
        case Call(function, args):
            values = [_eval(a, columns) for a in args]
            return _finite(_call(function, values, args))
    raise ValueError(f"unknown formula node {node!r}")


def _call(function: str, values: list[Values], args: tuple[Node, ...]) -> Values:
    if function in _UNARY:
        return _number(_UNARY[function](values[0]))
    if function == "round":
        digits = int(args[1].value) if len(args) == 2 and isinstance(args[1], Number) else 0
        x = values[0]
        # Arrow raises when x * 10**digits overflows; such a value rounds to null instead.
        fits = pc.is_finite(pc.multiply(pc.abs(x), 10.0**digits))
        x = pc.if_else(fits, x, pa.scalar(None, pa.float64()))
        return pc.round(x, ndigits=digits, round_mode="half_towards_infinity")
    if function == "min":
        return pc.min_element_wise(*values, skip_nulls=False)
    if function == "max":
        return pc.max_element_wise(*values, skip_nulls=False)
    if function == "if":
        return pc.if_else(_truth(values[0]), values[1], values[2])
    raise ValueError(f"unknown formula function {function!r}")
