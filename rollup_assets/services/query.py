"""The public read path: logical columns of a rollup (or the rows of a raw archive).

`query_arrow` needs no Spark (the CLI uses it); `query_spark` returns a lazy DataFrame for large
reads. Both resolve the active generation per bucket from one consistent snapshot, select buckets
with `bucket_start` in `[start, end)`, and order by `bucket_start, entity_id`. `query_arrow` of
every entity reads the rollup's surface (`surface_reads.rows_now`): as it stands when it holds
exactly that snapshot's active rows (it records the versions it reflects), which it does between
runs; while it lags, with the cells changed since its publish read from the row table. A read of
named entities, an as-of read, and a read the surface cannot answer resolve the pointers.

With `as_of`, they return what a reader saw at that time: the row and pointer tables (a raw
archive's table) at the versions current then, found from the commit times in their logs
(`RollupStore.snapshot_at`).
"""

from collections.abc import Sequence
from datetime import datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from rollup_assets.compute.aggregation import logical_columns
from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.model.errors import AsOfUnavailableError
from rollup_assets.model.specs import ArchiveSpec, RollupSpec
from rollup_assets.model.windows import as_utc, iso_utc, span
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_reads import rows_now


def query_arrow(
    engine: Engine,
    archive: str,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    as_of: datetime | None = None,
) -> pa.Table:
    """Rows of `archive` (rollup: logical columns) whose bucket start / time is in [start, end),
    as a reader saw them at `as_of` (None: now)."""
    return query_versions(engine, archive, start, end, entities, as_of)[0]


def query_versions(
    engine: Engine,
    archive: str,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    as_of: datetime | None = None,
) -> tuple[pa.Table, dict[str, int]]:
    """`query_arrow`, and the table versions the rows were read at (table name -> version; a
    rollup's row and pointer tables, a raw archive's table; -1 for a table not created yet)."""
    spec = engine.catalog.archive(archive)
    engine.require_activated(spec)
    if as_of is None:
        return _read_versions(engine, spec, start, end, entities, None)
    at = as_utc(as_of)
    try:
        return _read_versions(engine, spec, start, end, entities, at)
    except (OSError, pa.ArrowException) as exc:
        # The log still lists that version, but its files are gone (e.g. a warehouse restored
        # from a backup holds only the backed-up version's files).
        raise AsOfUnavailableError(
            f"'{spec.name}' as of {iso_utc(at)}: the files of that version are no longer "
            f"readable ({exc})"
        ) from exc


def _read_versions(
    engine: Engine,
    spec: ArchiveSpec,
    start: datetime | None,
    end: datetime | None,
    entities: Sequence[str] | None,
    as_of: datetime | None,
) -> tuple[pa.Table, dict[str, int]]:
    ents = frozenset(entities) if entities else None
    if isinstance(spec, RollupSpec):
        # The surface is sorted by bucket, the row table by entity: a read of a few entities
        # decodes fewer rows from the row table.
        if as_of is None and ents is None:
            current = rows_now(engine, spec, span(start, end))
            if current is not None:
                return current.rows, current.reflects.lineage(spec)
        snap = (
            engine.rollups.snapshot(spec)
            if as_of is None
            else engine.rollups.snapshot_at(spec, as_of)
        )
        versions = snap.lineage(spec)
        needed = ["entity_id", "bucket_start", "bucket_end", *(c.name for c in spec.stored_columns)]
        rows = engine.rollups.read_arrow(
            spec, [span(start, end)], ents, snapshot=snap, columns=needed
        )
        return logical_arrow(rows, spec), versions
    table = engine.raw.table(spec) if as_of is None else engine.raw.table_at(spec, as_of)
    data = engine.raw.read_arrow(spec, [span(start, end)], ents, table=table)
    data = data.drop_columns(["day"])
    time_col = data.column_names[1]
    versions = {spec.name: -1 if table is None else table.version()}
    return data.sort_by([(time_col, "ascending"), ("entity_id", "ascending")]), versions


def query_spark(
    engine: Engine,
    spark: SparkSession,
    archive: str,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    as_of: datetime | None = None,
) -> DataFrame:
    """A rollup's logical columns as a lazy DataFrame (as a reader saw them at `as_of`)."""
    spec = engine.catalog.rollup(archive)
    engine.require_activated(spec)
    ents = frozenset(entities) if entities else None
    snap = None if as_of is None else engine.rollups.snapshot_at(spec, as_utc(as_of))
    rows = engine.rollups.read_spark(spark, spec, [span(start, end)], ents, snapshot=snap)
    return logical_columns(rows, spec).orderBy("bucket_start", "entity_id")
