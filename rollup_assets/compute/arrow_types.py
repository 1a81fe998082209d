"""The Arrow types of what the warehouse stores: every instant in microseconds, UTC, and each
type a column of the model may have (`model.specs.ColumnType`)."""

import pyarrow as pa

from rollup_assets.model.column_types import ColumnType

TS = pa.timestamp("us", tz="UTC")
ARROW_TYPES: dict[ColumnType, pa.DataType] = {
    ColumnType.DOUBLE: pa.float64(),
    ColumnType.LONG: pa.int64(),
    ColumnType.BOOLEAN: pa.bool_(),
    ColumnType.STRING: pa.string(),
    ColumnType.INT: pa.int32(),
    ColumnType.TIMESTAMP: TS,
}


def arrow_type(column_type: ColumnType, listed: bool = False) -> pa.DataType:
    """The Arrow type of a column of `column_type` values, or of lists of them (`listed`: a
    companion's spare extremes, a difference row's values entering and leaving its cell)."""
    t = ARROW_TYPES[column_type]
    return pa.list_(t) if listed else t
