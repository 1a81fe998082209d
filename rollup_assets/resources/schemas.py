"""The physical schemas of the tables this project writes, derived from the specs.

Raw and time-range tables hold the key columns, the declared value columns and the UTC `day`
partition; rollup tables hold the columns of a rollup's rows (`model.partials.row_columns`:
the cell, its partials and their companions, generation and lineage) and the physical
partition `bucket_part`. Every timestamp is `timestamp[us, UTC]`, every column nullable (as
Spark writes them).
"""

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from rollup_assets.compute.arrow_types import ARROW_TYPES, TS, arrow_type
from rollup_assets.model.bucketing import StorageUnit, storage_unit
from rollup_assets.model.partials import DELTA_COLUMN, row_columns
from rollup_assets.model.specs import (
    DAY_COLUMN,
    ENTITY_COLUMN,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
    key_columns,
)

PART_COLUMN = "bucket_part"


# A computed column's field carries its formula and type: the table itself records which
# formulas its rows were computed with (see `rollup_assets/resources/raw_columns.py`).
FORMULA_KEY = "rollups.formula"
TYPE_KEY = "rollups.type"


def archive_schema(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> pa.Schema:
    """The Delta schema of a raw or time-range table (`day` is the UTC partition date)."""
    keys = [pa.field(ENTITY_COLUMN, pa.string())]
    keys += [pa.field(c, TS) for c in key_columns(spec)[1:]]
    values = [
        pa.field(
            c.name,
            ARROW_TYPES[c.type],
            metadata=(
                {FORMULA_KEY: c.formula.text, TYPE_KEY: c.type.value}
                if c.formula is not None
                else None
            ),
        )
        for c in spec.columns
    ]
    return pa.schema([*keys, *values, pa.field(DAY_COLUMN, pa.date32())])


def archive_data_schema(spec: RawArchiveSpec | TimeRangeArchiveSpec) -> pa.Schema:
    """The columns stored inside a raw file (the `day` partition column lives in the path)."""
    s = archive_schema(spec)
    return s.remove(s.get_field_index(DAY_COLUMN))


def table_schema(spec: RollupSpec) -> pa.Schema:
    """A rollup table: the columns of its rows (`model.partials.row_columns`) and the storage
    partition."""
    fields = [pa.field(c.name, arrow_type(c.type, c.listed)) for c in row_columns(spec)]
    return pa.schema([*fields, pa.field(PART_COLUMN, pa.string())])


def data_schema(spec: RollupSpec) -> pa.Schema:
    """The columns stored inside a rollup's Parquet files (the partition lives in the path)."""
    s = table_schema(spec)
    return s.remove(s.get_field_index(PART_COLUMN))


def spark_schema(schema: pa.Schema) -> T.StructType:
    """The Spark schema that reads files of `schema` (every field nullable)."""
    spark = from_arrow_schema(schema)
    return T.StructType([T.StructField(f.name, f.dataType, True) for f in spark.fields])


_PART_FORMATS = {
    StorageUnit.DAY: "yyyy-MM-dd",
    StorageUnit.MONTH: "yyyy-MM",
    StorageUnit.YEAR: "yyyy",
}


def part_format(spec: RollupSpec) -> str:
    """Physical partitioning (`bucketing.storage_unit`): UTC day for buckets of a day or less,
    month for days and FixedSize buckets under a week, year above; by the bucket's start."""
    return _PART_FORMATS[storage_unit(spec)]


def part_values(spec: RollupSpec, starts: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    """The physical partition (`part_format`) of each bucket start, as Arrow computes it."""
    fmt = {"yyyy-MM-dd": "%Y-%m-%d", "yyyy-MM": "%Y-%m", "yyyy": "%Y"}[part_format(spec)]
    # Formatted once per distinct start (a range holds many rows per bucket).
    whole = starts.combine_chunks() if isinstance(starts, pa.ChunkedArray) else starts
    encoded = pc.dictionary_encode(whole)
    names = pc.strftime(encoded.dictionary, format=fmt)
    return pa.chunked_array([names.take(encoded.indices)], pa.string())


def with_row_shape(rows: pa.Table, schema: pa.Schema) -> pa.Table:
    """`rows` with every column of `schema` they lack: a base row has no values entering or
    leaving its cell (null) and is no difference row (`delta` false); a difference row has no
    state (null)."""
    n = rows.num_rows
    for f in schema:
        if f.name in rows.column_names:
            continue
        if f.name == DELTA_COLUMN:
            rows = rows.append_column(f.name, pa.array([False] * n, pa.bool_()))
        else:
            rows = rows.append_column(f.name, pa.nulls(n, f.type))
    return rows
