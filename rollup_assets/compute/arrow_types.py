"""The Arrow types of what the warehouse stores: every instant in microseconds, UTC, and each
type a column of the model may have (`model.specs.ColumnType`)."""

from datetime import datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.windows import EPOCH

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


_MICROSECOND = timedelta(microseconds=1)


def instants(micros: np.ndarray) -> list[datetime]:
    """Microseconds since the epoch as UTC datetimes."""
    return [EPOCH + v * _MICROSECOND for v in np.asarray(micros, dtype=np.int64).tolist()]


def instants_of(values: pa.Array | pa.ChunkedArray) -> list[datetime]:
    """A timestamp column's values (none null) as UTC datetimes. Arrow's `to_pylist` of zoned
    timestamps converts each value through its zone, some fifteen times slower."""
    micros = pc.cast(pc.cast(values, TS), pa.int64())
    if micros.null_count:
        raise ValueError(f"{micros.null_count} null instant(s) where none may be")
    return instants(micros.to_numpy())


def by_start_and_entity(rows: pa.Table) -> pa.Table:
    """`rows` sorted by `bucket_start`, then `entity_id` (the order a query returns), as Arrow's
    `sort_by` on both sorts them. Arrow compares the strings of a multi-column sort row by row;
    here each distinct entity is ranked once (in Arrow's own string order) and numpy sorts the
    two integer keys, several times faster for the rows a read returns."""
    entity = rows["entity_id"]
    if rows.num_rows < 2 or entity.null_count or rows["bucket_start"].null_count:
        return rows.sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
    encoded = pc.dictionary_encode(entity).combine_chunks()
    rank = np.empty(len(encoded.dictionary), dtype=np.int64)
    rank[pc.sort_indices(encoded.dictionary).to_numpy()] = np.arange(len(rank))
    starts = rows["bucket_start"].cast(pa.int64()).to_numpy()
    order = np.lexsort((rank[encoded.indices.to_numpy()], starts))
    return rows.take(pa.array(order))


def is_by_start_and_entity(rows: pa.Table) -> bool:
    """Are `rows` ordered by bucket start, then entity (as `by_start_and_entity` sorts them)?"""
    n = rows.num_rows
    if n < 2:
        return True
    starts = rows["bucket_start"].cast(pa.int64()).to_numpy()
    steps = np.diff(starts)
    if (steps < 0).any():
        return False
    ties = steps == 0
    if not ties.any():
        return True
    entity = rows["entity_id"]
    ascending = pc.greater(entity.slice(1), entity.slice(0, n - 1))
    return bool(np.all(~ties | ascending.to_numpy(zero_copy_only=False)))
