"""A rollup's difference rows of some cells within generation ranges: what a read folds onto a
state of those cells it already holds (a surface row, as of its publish) to bring them to a
later snapshot, without reading their base rows.

Corrections write their difference rows in files of their own, a generation each: by file
statistics (bucket start, generation, whether it holds a difference row) and row-group
statistics, a read of a few cells' newest differences opens only those files.
"""

import urllib.parse
from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from rollup_assets.model.aggregates import DELTA_KINDS
from rollup_assets.model.partials import CELL_COLUMNS, GENERATION
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import micros
from rollup_assets.resources.delta_files import TargetIndex, read_row_groups
from rollup_assets.resources.readers import READERS
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.rollup_table import RollupTable, cells_of_rows
from rollup_assets.resources.schemas import DELTA_COLUMN, data_schema, with_row_shape
from rollup_assets.resources.warehouse import filesystem_for

# The columns of the cells asked for: the cell, and its generation range (after, upto].
AFTER, UPTO = "after", "upto"
_CELL = ["bucket_start", ENTITY_COLUMN]


def differences_of(
    table: RollupTable, spec: RollupSpec, snap: Snapshot, cells: pa.Table
) -> pa.Table:
    """The difference rows (in the stored columns) of `cells` (bucket_start, bucket_end,
    entity_id, `AFTER`, `UPTO`: one row per cell) whose generation is in (after, upto]; read
    from the snapshot's files whose statistics may hold one, and of those only the row groups
    that may hold the cells."""
    stored = data_schema(spec)
    # A difference row holds its cell, its generation and the values entering and leaving it;
    # its other columns are null, and are not read.
    moved = [c.name for c in spec.companions if c.kind in DELTA_KINDS]
    schema = pa.schema([stored.field(n) for n in (*CELL_COLUMNS, GENERATION, DELTA_COLUMN, *moved)])
    if snap.table is None or cells.num_rows == 0:
        return stored.empty_table()
    files = _may_hold(snap.files(), cells)
    if not files:
        return stored.empty_table()
    rows = _difference_rows(table, spec, files, schema, cells)
    rows = rows.take(pa.array(np.flatnonzero(_in_ranges(rows, cells)), pa.int64()))
    return with_row_shape(rows, stored).select(stored.names)


def _difference_rows(
    table: RollupTable, spec: RollupSpec, files: list[dict], schema: pa.Schema, cells: pa.Table
) -> pa.Table:
    """The difference rows of `files`, in `schema`: the files are small (a correction's own),
    so they are scanned as one dataset, whose reader opens them side by side without a Python
    call per file; a file whose columns are of other types is read on its own and cast."""
    fs, root = filesystem_for(table.uri(spec), table.options)
    paths = [f"{root}/{urllib.parse.unquote(f['path'])}" for f in files]
    only = pc.field(DELTA_COLUMN) == pa.scalar(True)
    try:
        dataset = ds.dataset(paths, schema=schema, format="parquet", filesystem=fs)
        return dataset.to_table(columns=schema.names, filter=only)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        pass
    targets = TargetIndex(list(cells_of_rows(cells)))
    uri, options = table.uri(spec), table.options

    def read(f: dict) -> pa.Table:
        data = read_row_groups(uri, options, f["path"], schema.names, "bucket_start", targets)
        data = data.cast(schema)
        return data.filter(pc.fill_null(data[DELTA_COLUMN], False))

    return pa.concat_tables([schema.empty_table(), *READERS.map(read, files)])


def _may_hold(files: Sequence[dict], cells: pa.Table) -> list[dict]:
    """The files whose statistics do not rule out a difference row of one of `cells` in its
    generation range (a file without them is kept)."""
    order = pc.sort_indices(cells["bucket_start"]).to_numpy()
    starts = cells["bucket_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)[order]
    after = cells[AFTER].to_numpy(zero_copy_only=False)[order]
    upto = cells[UPTO].to_numpy(zero_copy_only=False)[order]
    out = []
    for f in files:
        if f.get("max.delta") is False:  # base rows only
            continue
        lo, hi = f.get("min.bucket_start"), f.get("max.bucket_start")
        g_lo, g_hi = f.get("min.generation"), f.get("max.generation")
        if lo is None or hi is None or g_lo is None or g_hi is None:
            out.append(f)
            continue
        a = int(np.searchsorted(starts, micros(lo), "left"))
        b = int(np.searchsorted(starts, micros(hi), "right"))
        if np.any((after[a:b] < g_hi) & (upto[a:b] >= g_lo)):
            out.append(f)
    return out


def _in_ranges(rows: pa.Table, cells: pa.Table) -> np.ndarray:
    """Which of `rows` are of one of `cells` with a generation in its range."""
    hit = np.zeros(rows.num_rows, dtype=bool)
    if rows.num_rows == 0:
        return hit
    at = rows.select([*_CELL, "generation"]).append_column(
        "__row", pa.array(np.arange(rows.num_rows), pa.int64())
    )
    ranges = cells.select([*_CELL, AFTER, UPTO]).cast(
        pa.schema([rows.schema.field(c) for c in _CELL])
        .append(pa.field(AFTER, pa.int64()))
        .append(pa.field(UPTO, pa.int64()))
    )
    joined = at.join(ranges, _CELL, join_type="inner")
    g = joined["generation"]
    inside = pc.and_(pc.greater(g, joined[AFTER]), pc.less_equal(g, joined[UPTO]))
    hit[joined["__row"].filter(pc.fill_null(inside, False)).to_numpy()] = True
    return hit
