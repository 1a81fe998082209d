"""Telling which rows of a table match a set of keys (`KeyIndex`): the cells a correction or a
read names, matched against the rows of many files without a join per file.
"""

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# Keys whose columns' distinct values multiply past this are matched by a join (see `KeyIndex`).
CODED_KEYS = 2.0**62


class KeyIndex:
    """The distinct rows of `keys` (its columns `names`, or all of them), coded once so that
    telling which rows of a table match one is a hash look-up per column (in the column's
    distinct key values) and a NumPy search, not a join of every key: a read narrowing hundreds
    of files to the same keys codes them once. Each key column's distinct values number a digit
    of a mixed-radix code; keys too many to code in 62 bits (`CODED_KEYS`), and rows whose key
    columns are of other types (or dictionary-encoded), are matched by a join instead."""

    def __init__(self, keys: pa.Table, names: Sequence[str] | None = None) -> None:
        self.names = list(keys.column_names if names is None else names)
        self.keys = keys.select(self.names)
        # A null matches nothing, as in a join.
        self.values = [pc.drop_null(pc.unique(keys[n].combine_chunks())) for n in self.names]
        sizes = [max(1, len(v)) for v in self.values]
        self.coded = float(np.prod(np.array(sizes, dtype=np.float64))) < CODED_KEYS and not any(
            pa.types.is_dictionary(v.type) for v in self.values
        )
        code, known = self._code(self.keys) if self.coded else (np.zeros(0, np.int64), None)
        self.codes = np.unique(code[known] if known is not None else code)

    def _code(self, rows: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Per row, its code and whether every key value of it is one of the keys'."""
        code = np.zeros(rows.num_rows, dtype=np.int64)
        known = np.ones(rows.num_rows, dtype=bool)
        for name, values in zip(self.names, self.values, strict=True):
            column = rows[name]
            digit = pc.index_in(column, value_set=values)
            known &= pc.is_valid(digit).to_numpy(zero_copy_only=False)
            code = code * max(1, len(values)) + pc.fill_null(digit, 0).to_numpy(
                zero_copy_only=False
            ).astype(np.int64)
        return code, known

    def mask(self, rows: pa.Table) -> np.ndarray:
        """Which of `rows` match a key, as a join matches them (a key column of another type
        than the rows' is never cast)."""
        same = all(
            rows.schema.field(n).type == v.type
            for n, v in zip(self.names, self.values, strict=True)
        )
        if not self.coded or not same:
            index = pa.table({n: rows[n] for n in self.names}).append_column(
                "__i", pa.array(np.arange(rows.num_rows, dtype=np.int64))
            )
            hit = np.zeros(rows.num_rows, dtype=bool)
            hit[index.join(self.keys, self.names, join_type="left semi")["__i"].to_numpy()] = True
            return hit
        code, known = self._code(rows)
        if not len(self.codes):
            return np.zeros(rows.num_rows, dtype=bool)
        at = np.minimum(np.searchsorted(self.codes, code), len(self.codes) - 1)
        return known & (self.codes[at] == code)

    def rows_of(self, rows: pa.Table) -> pa.Table:
        """The rows of `rows` that match a key, in their order and in a copy of their own (a
        read that narrows hundreds of files this way keeps no file's buffers alive)."""
        return rows.take(pa.array(np.flatnonzero(self.mask(rows)), pa.int64()))


def rows_with_keys(rows: pa.Table, keys: pa.Table, names: Sequence[str]) -> pa.Table:
    """The rows of `rows` whose columns `names` match a row of `keys`, in their order and in a
    copy of their own (`KeyIndex.rows_of`)."""
    return KeyIndex(keys, names).rows_of(rows)
