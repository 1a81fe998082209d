"""The type of a value column, and the types a formula may compute and read."""

from enum import StrEnum


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
