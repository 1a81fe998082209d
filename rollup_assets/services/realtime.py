"""Real-time reads: stored buckets below a rollup's watermark, the newer ones aggregated from the
source on the fly.

A rollup's buckets below its watermark are closed: the forward lane wrote them, and corrections
recompute them. The buckets from the watermark on (the open bucket, and buckets that ended but
are not closed yet) are aggregated here from the source, with the same rules as the forward
lane's (`compute.arrow_partials`): from the raw or time-range rows, or, for a rollup of a rollup,
from the level below read in real time itself (recursively), so the newest source rows show at
every level before the forward lane closes their buckets. A stored row above the watermark (an
open bucket the forward lane refreshed) is superseded by the fresh aggregation.

Frozen buckets are never aggregated on the fly: a freeze holds writes back from its range, so a
real-time read shows what is stored there, as a plain read does.
"""

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_partials import logical_arrow, partials_arrow
from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import FAR_FUTURE, Window, as_utc, span
from rollup_assets.resources.rollup_snapshots import Snapshot
from rollup_assets.resources.schemas import data_schema
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_reads import rows_now

_END_OF_TIME = as_utc(FAR_FUTURE)
# Aggregates the live buckets of a read while it reads the stored ones (its own pool: the stored
# read uses the rollup store's readers).
_LIVE = ThreadPoolExecutor(max_workers=2, thread_name_prefix="live")


def partial_schema(spec: RollupSpec) -> pa.Schema:
    """The columns of a partial row: entity_id, bucket_start, bucket_end and the stored partials."""
    stored = data_schema(spec)
    names = [ENTITY_COLUMN, "bucket_start", "bucket_end", *(c.name for c in spec.stored_columns)]
    return pa.schema([stored.field(n) for n in names])


def stored_partials(
    engine: Engine,
    spec: RollupSpec,
    window: Window,
    entities: frozenset[str] | None,
    snapshot: Snapshot | None = None,
) -> pa.Table:
    """The active stored partial rows of `spec` whose bucket starts in `window`."""
    schema = partial_schema(spec)
    rows = engine.rollups.read_arrow(
        spec, [window], entities, snapshot=snapshot, columns=schema.names
    )
    return rows.select(schema.names).cast(schema)


def live_from(spec: RollupSpec, state: ArchiveState) -> datetime:
    """Where a real-time read of `spec` stops reading stored buckets: its watermark (the end of
    its closed buckets), or past its frozen buckets when the freeze reaches further."""
    b = Bucketing.of(spec)
    mark = state.watermark if state.watermark is not None else first_bucket_start(spec)
    if state.frozen_until is not None:
        # Buckets ending at or before `frozen_until` are frozen; the first one after starts at
        # the floor of `frozen_until`.
        mark = max(mark, b.floor(state.frozen_until))
    return mark


def realtime_partials(
    engine: Engine,
    spec: RollupSpec,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: frozenset[str] | None = None,
) -> pa.Table:
    """Partial rows (`partial_schema`) of `spec`'s buckets starting in [start, end): stored
    below `live_from`, aggregated from the source (read in real time when it is a rollup) from
    there on."""
    state = engine.require_activated(spec)
    window = span(start, end)
    cut = live_from(spec, state)
    parts = []
    if window.start < min(window.end, cut):
        parts.append(
            stored_partials(engine, spec, Window(window.start, min(window.end, cut)), entities)
        )
    if max(window.start, cut) < window.end:
        parts.append(
            _aggregated(engine, spec, Window(max(window.start, cut), window.end), entities)
        )
    if not parts:
        return partial_schema(spec).empty_table()
    return pa.concat_tables(parts)


def realtime_arrow(
    engine: Engine,
    archive: str,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
) -> pa.Table:
    """`query_arrow` of a rollup in real time: the logical columns of its buckets starting in
    [start, end), stored below the watermark and aggregated from the source above it. A read of
    every entity takes the stored buckets from the surface, as a query does."""
    spec = engine.catalog.rollup(archive)
    ents = frozenset(entities) if entities else None
    if ents is None:
        # The stored buckets of every entity from the surface (as a query reads them), the rest
        # aggregated now, side by side (both mostly read and decode Parquet, which releases the
        # GIL).
        state = engine.require_activated(spec)
        window, cut = span(start, end), live_from(spec, state)
        below = Window(window.start, min(window.end, cut))
        above = Window(max(window.start, cut), window.end)
        fresh = (
            _LIVE.submit(_aggregated, engine, spec, above, None)
            if above.start < above.end
            else None
        )
        current = rows_now(engine, spec, below) if below.start < below.end else None
        stored = None if current is None else current.rows
        if stored is not None:
            live = (
                [] if fresh is None else [logical_arrow(fresh.result(), spec).cast(stored.schema)]
            )
            return pa.concat_tables([stored, *live])
        if fresh is not None and not fresh.cancel():
            wait([fresh])  # it started: let it finish before reading again
    rows = realtime_partials(engine, spec, start, end, ents)
    return logical_arrow(rows, spec)


def _aggregated(
    engine: Engine, spec: RollupSpec, window: Window, entities: frozenset[str] | None
) -> pa.Table:
    """Partials of `spec`'s buckets starting in `window`, aggregated from its source now."""
    schema = partial_schema(spec)
    source = engine.catalog.archive(spec.source)
    b = Bucketing.of(spec)
    lo = b.ceil(window.start)
    hi = window.end if window.end >= _END_OF_TIME else b.ceil(window.end)
    if lo >= hi:
        return schema.empty_table()
    if isinstance(source, RollupSpec):
        rows = realtime_partials(engine, source, lo, hi, entities)
    else:
        rows, _ = engine.raw.read_rows(source, [Window(lo, hi)], entities)
    if rows.num_rows == 0:
        return schema.empty_table()
    last = pc.max(rows[source.time_column]).as_py()
    windows = [w for w in b.windows(lo, as_utc(last) + timedelta(microseconds=1)) if w.start < hi]
    out = partials_arrow(rows, windows, None, spec, source, companions=False)
    return out.drop_columns([SOURCE_ROWS]).select(schema.names).cast(schema)
