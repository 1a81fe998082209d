"""The surface's file layout: within each partition, files of whole entities, each covering a
contiguous range of entity ids and holding at most `SURFACE_FILE_ROWS` rows.

Why entity ranges. A correction changes a few cells (entity, bucket); a partition holds every
entity's rows of a UTC day, month or year. With one file per partition a publish rewrote the
partition's rows of every entity to replace one cell, so its cost grew with the number of
entities. Cut by entity range, the file holding a changed cell is found from the files' own
statistics (min/max `entity_id`), and a publish rewrites only that file: at most
`SURFACE_FILE_ROWS` rows per changed cell whatever the number of entities. A changed bucket of
every entity (a forward refresh, a bucket recomputed whole) still rewrites its partition.

A partition's rows are cut into files in (entity, bucket start) order, between entities. Inside
a file they are ordered by bucket start, then entity: a reader filtering on time skips row
groups (its entity filter skips whole files), and the query path puts a partition's files back
in query order (bucket start, entity) by merging as many sorted runs as there are files
(`in_query_order`), not by sorting on both columns.

How files stay within the cap. A rewritten file that would exceed it is split into
`ceil(rows / SURFACE_FILE_ROWS)` files of about equal size, cut between entities; a cell of an
entity no file holds yet goes to the file whose range it extends (`claims`), so ranges stay
disjoint. One entity is never split: an entity with more rows in a partition than the cap (a
sub-minute rollup) gets a file of its own, larger than the cap. Maintenance merges neighbouring
files that a shrinking partition left small (`compaction_groups`), instead of Delta's own
compaction, which would pack files of unrelated entity ranges together.

Columns. The logical columns a query returns (`entity_id`, `bucket_start`, `bucket_end`, one
per aggregation: an average as its value), `bucket_part`, then each average's sum and count
(`<output>__sum`, `<output>__count`, as the row table stores them): with them a reader merges
buckets into coarser steps exactly (an average of averages would not be), and `downsample` reads
the surface instead of resolving the pointers. Then the cell's *fold state* (`fold_state`): how
many source rows it holds (`raw_rows`) and, per aggregated column, the companions a difference
applies to (`<column>__n`, `__total`, `__nan`, `__pinf`, `__ninf`, as the row table stores them;
`__lo` and `__hi` the first `SURFACE_SPARES` kept extremes). While the
surface lags, a query folds the differences written since the publish onto that state
(`surface_fold`) instead of reading the cell's base row from the row table. A row whose state a
difference cannot be folded onto (its cell was aggregated again when it was published) holds no
`raw_rows`. Every publish records the surface's `FORMAT`; a surface of an older one is not read
by queries, and its next publish rebuilds it whole.
"""

import bisect
import functools
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.compute.arrow_types import by_start_and_entity
from rollup_assets.model.cells import Cells
from rollup_assets.model.partials import EXTREMES, state_columns
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.schemas import PART_COLUMN, data_schema, part_values

# Rows per surface file at most (one entity's rows are never split). Chosen by measurement
# (docs/performance.md, "The surface's files"): a plain reader pays about 1.5 ms for each file it
# opens (delta-rs builds a fragment per file, pyarrow parses its footer), and a file of this many
# rows takes about 4 ms to read, so a year of daily rows of 10,000 meters in files of 131,072
# rows (37 files) reads in about 1.3x the time of its 13 partition-sized files, where 16,384 (228
# files) took 3.4x and 65,536 (61) 1.5x. Below the cap (a month of daily rows of up to 4,000
# meters, a day of hourly rows of up to 5,000) a partition is one file. A one-cell publish reads
# and writes at most this many rows of each level, at any number of meters.
SURFACE_FILE_ROWS = 131_072
# The surface's format, recorded by each publish as a Delta application transaction (a surface
# recording none is of format 1: logical columns only).
FORMAT_APP = "rollups.surface.format"
FORMAT = 3
# Kept extremes of a minimum or maximum a surface row holds at most (of the row table's
# `SPARES`): a lagging read folds a correction onto the row unless they all left the cell since
# the publish. Measured on a wave of 1,000 scattered readings of a year of daily rows, keeping
# one (the extreme shown) sent 2.4 % of the corrected cells to the row table, and most of the
# read's time with them.
SURFACE_SPARES = 2


@functools.lru_cache(maxsize=256)
def surface_schema(spec: RollupSpec) -> pa.Schema:
    """The surface's columns: the logical columns of a query, the partition column, each
    average's sum and count (`averaged_partials`), then the fold state (`fold_state`). Worked
    out once per spec (every read asks, and the logical types come from running the query's
    own conversion on an empty table, about a millisecond)."""
    stored = data_schema(spec)
    logical = logical_arrow(stored.empty_table(), spec).schema
    with_part = logical.append(pa.field(PART_COLUMN, pa.string()))
    state = [stored.field(n) for n in fold_state(spec)]
    return pa.schema([*with_part, *(stored.field(n) for n in averaged_partials(spec)), *state])


def averaged_partials(spec: RollupSpec) -> list[str]:
    """The stored partial columns the logical columns do not hold: each average's sum and count."""
    outputs = set(spec.output_names)
    return [c.name for c in spec.stored_columns if c.name not in outputs]


def query_columns(spec: RollupSpec) -> list[str]:
    """The surface's columns a query returns, in order: its logical columns, without the
    partition column, the averages' partials and the fold state."""
    hidden = {PART_COLUMN, *averaged_partials(spec), *fold_state(spec)}
    return [n for n in surface_schema(spec).names if n not in hidden]


def fold_state(spec: RollupSpec) -> list[str]:
    """What a base row holds of its cell's state besides the partials (`state_columns`): the
    count of its source rows and the companions a difference applies to."""
    partials = {c.name for c in spec.stored_columns}
    return [c.name for c in state_columns(spec) if c.name not in partials]


def kept_extremes(spec: RollupSpec) -> set[str]:
    """The fold state's kept-extremes companions (the row table's lists, on the surface cut to
    their first `SURFACE_SPARES` values)."""
    return {c.name for c in spec.companions if c.kind in EXTREMES}


def as_surface_rows(rows: pa.Table, spec: RollupSpec, schema: pa.Schema) -> pa.Table:
    """Base-shaped rows (the cells, their partials and, when `rows` hold them, their fold state)
    as the surface's rows (`schema`), in query order. Without a fold state, a row's is null."""
    rows = by_start_and_entity(rows)
    # `logical_arrow` keeps the order: the partials and state taken from `rows` line up.
    out = logical_arrow(rows, spec, in_order=True)
    out = out.append_column(PART_COLUMN, part_values(spec, out["bucket_start"]))
    for name in averaged_partials(spec):
        out = out.append_column(name, rows[name])
    extremes = kept_extremes(spec)
    for name in fold_state(spec):
        field = schema.field(name)
        if name not in rows.column_names:
            values: pa.ChunkedArray | pa.Array = pa.nulls(rows.num_rows, field.type)
        elif name in extremes:
            values = pc.list_slice(rows[name], 0, SURFACE_SPARES)
        else:
            values = rows[name]
        out = out.append_column(name, values)
    return out.select(schema.names).cast(schema)


def in_current_format(surface: DeltaTable) -> bool:
    """Was the surface last published in this `FORMAT` (its columns are `surface_schema`'s)?"""
    return surface.transaction_version(FORMAT_APP) == FORMAT


@dataclass(frozen=True)
class EntityRange:
    """The entity ids a surface file holds, from its statistics (None: unknown, e.g. ids longer
    than the statistics keep)."""

    low: str | None
    high: str | None

    @classmethod
    def of(cls, f: dict) -> "EntityRange":
        low, high = f.get("min.entity_id"), f.get("max.entity_id")
        known = isinstance(low, str) and isinstance(high, str)
        return cls(low if known else None, high if known else None)

    @property
    def known(self) -> bool:
        return self.low is not None and self.high is not None

    def may_hold(self, entity: str) -> bool:
        """Can the file hold rows of `entity`? (Always, for a file of unknown range.)"""
        if self.low is None or self.high is None:
            return True
        return self.low <= entity <= self.high


def in_entity_order(files: Sequence[dict]) -> list[dict]:
    """The files of one partition by the first entity they hold (files of unknown range last)."""
    return sorted(
        files,
        key=lambda f: (not EntityRange.of(f).known, EntityRange.of(f).low or "", f["path"]),
    )


def claims(ordered: Sequence[dict], entities: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """`claimant` of each entity at once (-1: no file's range is known)."""
    lows = [r.low for r in map(EntityRange.of, ordered) if r.low is not None]
    values = entities.to_pylist()
    if not lows:
        return np.full(len(values), -1, dtype=np.int64)
    return np.array([max(0, bisect.bisect_right(lows, e) - 1) for e in values], dtype=np.int64)


def split_by_entity(rows: pa.Table, cap: int | None = None) -> list[pa.Table]:
    """Rows of one partition as the files they are written in (default cap:
    `SURFACE_FILE_ROWS`): pieces of whole entities, in entity order, each within the cap (but an
    entity with more rows than the cap, alone) and about equal in size, each ordered by bucket
    start, then entity."""
    cap = cap or SURFACE_FILE_ROWS
    n = rows.num_rows
    if n == 0:
        return []
    if n <= cap:
        return [by_start_and_entity(rows)]
    by_entity = rows.sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")])
    entity = by_entity["entity_id"]
    changes = pc.not_equal(entity.slice(1), entity.slice(0, n - 1)).to_numpy(zero_copy_only=False)
    # Where each entity's rows start, and the end: the only places a file may be cut.
    bounds = np.concatenate([[0], np.flatnonzero(changes) + 1, [n]])
    cuts = [0]
    while cuts[-1] < n:
        first = cuts[-1]
        left = n - first
        if left <= cap:
            cuts.append(n)
            continue
        # The rest in as few pieces as the cap allows, about equal: cut nearest to the first
        # piece's share, at an entity boundary within the cap (past one entity over the cap).
        target = first + left / math.ceil(left / cap)
        lo = int(np.searchsorted(bounds, first, side="right"))
        hi = int(np.searchsorted(bounds, first + cap, side="right"))
        within = bounds[lo:hi]
        cuts.append(
            int(within[np.argmin(np.abs(within - target))]) if len(within) else int(bounds[lo])
        )
    return [by_start_and_entity(by_entity.slice(a, b - a)) for a, b in itertools.pairwise(cuts)]


def in_query_order(parts: Sequence[pa.Table]) -> pa.Table:
    """The rows of one partition's files, given in entity order (each ordered by bucket start,
    then entity, with disjoint entity ranges), merged into query order (bucket start, entity):
    per bucket start, each file's run of rows with it, in file order. The runs are slices, not
    copies: merging three files of a month of 10,000 meters' daily rows by a `take` copied every
    row, most of the read's time. A file not ordered by bucket start (another writer's) is
    merged by a stable sort on bucket start, which keeps each bucket's rows in file order."""
    if not parts:
        raise ValueError("in_query_order needs at least one file's rows")
    held = [p for p in parts if p.num_rows]  # a file whose rows all lie outside the read
    if len(held) <= 1:
        return held[0] if held else parts[0]
    parts = held
    starts = [p["bucket_start"].cast(pa.int64()).to_numpy() for p in parts]
    steps = [np.diff(s) for s in starts]
    if any(bool((d < 0).any()) for d in steps):
        order = np.argsort(np.concatenate(starts), kind="stable")
        return pa.concat_tables(parts).take(pa.array(order))
    # Each file's distinct starts (the first value of each of its runs), then all of them.
    firsts = [
        s[np.concatenate([[0], np.flatnonzero(d) + 1])] for s, d in zip(starts, steps, strict=True)
    ]
    values = np.unique(np.concatenate(firsts))
    runs = [
        (np.searchsorted(s, values, "left"), np.searchsorted(s, values, "right")) for s in starts
    ]
    pieces = [
        part.slice(int(lo[j]), int(hi[j] - lo[j]))
        for j in range(len(values))
        for part, (lo, hi) in zip(parts, runs, strict=True)
        if hi[j] > lo[j]
    ]
    return pa.concat_tables(pieces)


def by_partition(table: pa.Table) -> list[tuple[str, pa.Table]]:
    """Slices of `table` (sorted by partition) per partition value."""
    if table.num_rows == 0:
        return []
    values = table[PART_COLUMN].to_pylist()
    out, first = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[first]:
            out.append((values[first], table.slice(first, i - first)))
            first = i
    return out


def compaction_groups(ordered: Sequence[dict], limit: int | None = None) -> list[list[dict]]:
    """Runs of neighbouring files of one partition (in entity order, ranges known) that together
    hold at most `limit` rows (default: half the cap, so a merged file has room to grow before
    it is split again): each run is merged into one file (runs of one file are left)."""
    limit = limit or SURFACE_FILE_ROWS // 2
    groups: list[list[dict]] = []
    run: list[dict] = []
    total = 0
    for f in ordered:
        rows = f.get("num_records")
        if not EntityRange.of(f).known or not isinstance(rows, int):
            run, total = _flush(groups, run), 0
            continue
        if run and total + rows > limit:
            run, total = _flush(groups, run), 0
        run.append(f)
        total += rows
    _flush(groups, run)
    return groups


def _flush(groups: list[list[dict]], run: list[dict]) -> list[dict]:
    if len(run) > 1:
        groups.append(run)
    return []


def files_to_read(ordered: Sequence[dict], cells: Cells, taker: np.ndarray) -> list[int]:
    """Indices of the files (of one partition, in entity order) that may hold a row of a changed
    cell (by their bucket and entity statistics) or take a new row (`taker`)."""
    whole = [w for w, scope in cells if scope is None]
    named = [(w, e) for w, scope in cells if scope is not None for e in scope]
    entities = sorted({e for _, e in named})
    spans = merge_windows([w for w, _ in named])
    out = set(int(i) for i in np.unique(taker) if i >= 0)
    for i, f in enumerate(ordered):
        lo, hi = f.get("min.bucket_start"), f.get("max.bucket_start")

        def meets(windows: list[Window], lo: object = lo, hi: object = hi) -> bool:
            if not isinstance(lo, datetime) or not isinstance(hi, datetime):
                return bool(windows)
            return any(w.start <= hi and lo < w.end for w in windows)

        if meets(whole):
            out.add(i)
            continue
        if not entities or not meets(spans):
            continue
        r = EntityRange.of(f)
        if r.low is None or r.high is None:
            out.add(i)
            continue
        j = bisect.bisect_left(entities, r.low)
        if j < len(entities) and entities[j] <= r.high:
            out.add(i)
    return sorted(out)
