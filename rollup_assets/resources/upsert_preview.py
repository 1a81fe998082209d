"""What an ingest of a file would change in a raw or time-range archive, computed on the
driver without writing: the upsert's rules (`upsert.py`) applied to the stored rows with the
file's keys."""

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.column_rules import stored_operands
from rollup_assets.model.specs import DAY_COLUMN, SourceSpec, key_columns
from rollup_assets.resources.batch_conversion import with_stored_operands
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.raw_ingest import validated
from rollup_assets.resources.raw_reads import stored_rows_of
from rollup_assets.resources.raw_tables import RawTables
from rollup_assets.resources.schemas import archive_schema


@dataclass(frozen=True)
class UpsertPreview:
    """What an ingest of a file would change, computed without writing."""

    archive: str
    version: int | None  # the table version the preview read (None: no table yet)
    rows: int  # rows in the file
    old: pa.Table  # the stored rows the upsert would replace (archive schema)
    new: pa.Table  # the rows it would insert or replace, as they would be stored

    @property
    def inserted(self) -> int:
        return self.new.num_rows - self.old.num_rows

    @property
    def updated(self) -> int:
        return self.old.num_rows

    @property
    def unchanged(self) -> int:
        return self.rows - self.new.num_rows


def preview_ingest(
    tables: RawTables,
    spec: SourceSpec,
    path: str | Path,
    *,
    not_before: dt.datetime | None = None,
) -> UpsertPreview:
    """What an ingest of `path` would change, writing nothing: the same validation (raises
    IngestValidationError), then the upsert's rules applied on the driver to the stored rows
    with the file's keys."""
    table = tables.table(spec)
    spec = tables.applied(spec, table)
    reader, summary = validated(spec, path, not_before, None)
    batch = pa.Table.from_batches(list(reader.chunks()), schema=reader.schema)
    stored = stored_rows_of(tables, spec, batch, [] if table is None else file_actions(table))
    day = archive_schema(spec).field(DAY_COLUMN)
    stored = stored.append_column(day, pc.cast(stored[spec.time_column], day.type))
    operands = stored_operands(spec)
    if operands:
        batch = pa.Table.from_batches(
            [with_stored_operands(spec, b, stored, operands) for b in batch.to_batches()],
            schema=reader.schema,
        ).cast(reader.schema)
    keys = key_columns(spec)
    values = [c.name for c in spec.columns]
    t = stored.select([*keys, *values]).rename_columns([*keys, *[f"t__{c}" for c in values]])
    t = t.append_column("__t", pa.array([True] * t.num_rows, pa.bool_()))
    joined = batch.join(t, keys, join_type="left outer")
    matched = pc.fill_null(joined["__t"], False)
    changed = pc.invert(matched)
    merged = {}
    takes_batch = {c.name for c in spec.columns if c.required or c.is_computed}
    for c in values:
        s, old = joined[c], joined[f"t__{c}"]
        if c in takes_batch:
            merged[c] = s
            differs = _distinct(s, old)
        else:
            merged[c] = pc.if_else(pc.is_null(s), old, s)
            differs = pc.and_(pc.is_valid(s), _distinct(s, old))
        changed = pc.or_(changed, pc.and_(matched, differs))
    new = joined.select([*keys, DAY_COLUMN])
    for c in values:
        new = new.append_column(c, merged[c])
    new = new.select(stored.schema.names).cast(stored.schema).filter(changed)
    replaced = new.select(keys).join(stored, keys, join_type="inner")
    old_rows = replaced.select(stored.schema.names).cast(stored.schema)
    return UpsertPreview(
        spec.name, None if table is None else table.version(), summary.rows, old_rows, new
    )


def _distinct(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    """`a IS DISTINCT FROM b`, NaN equal to NaN."""
    same = pc.or_(pc.fill_null(pc.equal(a, b), False), pc.and_(pc.is_null(a), pc.is_null(b)))
    if pa.types.is_floating(a.type):
        same = pc.or_(same, pc.fill_null(pc.and_(pc.is_nan(a), pc.is_nan(b)), False))
    return pc.invert(same)
