"""The surface: a Delta table of each rollup's active rows, for readers outside this project
(and for this project's own queries of every entity while it is current: `current_rows`).

A rollup's row table (`rollups/<rollup>/`) holds every generation, and its pointer table says
which one is active; a plain Delta reader (delta-rs, DuckDB, Polars, Trino, Databricks SQL)
knows nothing of the pointers and would count a corrected cell once per generation kept. The
surface, `rollups/<rollup>__active/`, holds exactly the active rows, in the logical columns a
query returns (`entity_id`, `bucket_start`, `bucket_end`, one column per aggregation; an
average as its value, not its partials) plus `bucket_part`, the UTC day, month or year of
`bucket_start` it is partitioned by (the row table's physical partitioning).

What it reflects. Each surface commit records, as two Delta application transactions, the
pointer-table version and the row-table version whose active rows it holds (`-1`: no table
yet). `publish` brings it up to date: it takes a consistent snapshot of the rollup
(`RollupStore.snapshot`), works out which buckets may have changed since the recorded versions,
and replaces the surface rows of exactly those buckets with the snapshot's active rows, in ONE
commit. Active rows change in two ways only:
  * a pointer commit (a flip, a rewind, a rollback): the buckets of the pointers that differ
    between the recorded pointer version and now;
  * a forward-lane commit of the row table (generation-0 rows replaced in place): the buckets
    its added files' statistics span.
Every other row-table commit (a recompute's invisible rows, sweeps, reclaims, compaction) leaves
the active rows as they were. When the changes cannot be worked out (no surface yet, an old
version whose log or files are gone, e.g. after a restore, a commit of a kind not listed above,
or recorded versions newer than the tables, i.e. a re-created rollup) the surface is rebuilt
whole, still in one commit.

Atomicity. A flip (or forward commit) and the surface commit are two Delta commits. A plain
reader between them sees the surface's previous state: every row active as of the previous
flip, consistent in itself. A crash between them leaves the surface lagging, and since it says
what it reflects, the next `publish` repairs it: the recompute and forward lanes publish before
their own work and right after their commit, maintenance publishes every rollup, the asset check
publishes the rollup it checks, a restore publishes every rollup, and `rollups publish` does it
on demand. A surface missing for an existing rollup (an archive created before surfaces
existed) is built whole by the first of these.

Cost. The surface is partitioned like the row table (by UTC day below a day, month for days,
year above), and a publish rewrites only the surface files holding rows of the changed buckets
(their other rows are carried over): a one-cell correction rewrites the files of one bucket's
partition, never the whole year. The changed cells' rows are read from the row table, or taken
from the recompute that just wrote them (`Known`). Smaller files per partition would carry
fewer rows over, but every plain reader of the surface would then open several times the files.

Concurrency. One writer runs per rollup, but maintenance, checks and a manual publish may
publish at the same time. A publish commits through `delta_tables.commit`: on a conflict (a
concurrent publish records the same application ids; a compaction removed a file it rewrites)
it is planned again from fresh snapshots. Every plan is a pure function of the surface snapshot
it was given and the rollup snapshot it then takes, so whichever publish lands last, the
surface holds the rows of the versions it records, and a publish that lands with older versions
than the newest leaves a lag the next publish repairs.
"""

import bisect
import json
import logging
import os
import urllib.parse
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import cached_property

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from resources.delta_files import add_action, partition_dir, read_row_groups, write_file
from resources.delta_tables import (
    NO_DATA_OPERATIONS,
    CommitPlan,
    commit,
    file_actions,
    open_table,
    prune_files,
    read_commit,
    remove_action,
)
from resources.genmap import GENMAP_SCHEMA, covered_mask
from resources.rollup_store import READERS, REPLACED_KEY, Reflected, Snapshot
from resources.rollup_table import in_windows
from resources.schemas import PART_COLUMN, data_schema, part_values
from resources.warehouse import filesystem_for
from rollup_assets import metrics
from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.model.bucketing import storage_partition
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Trigger
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import FAR_FUTURE, FAR_PAST, Window, as_utc, merge_windows
from rollup_assets.services.engine import Engine

log = logging.getLogger(__name__)

# Application transactions of a surface commit: the versions of the rollup's tables it reflects.
GENMAP_APP = "rollups.surface.genmap"
ROWS_APP = "rollups.surface.rows"
# Row-table commits that change which rows are active: the forward lane's in-place writes.
FORWARD_OPERATIONS = frozenset({Trigger.FORWARD.value, Trigger.OPEN_BUCKET.value})
# Row-table commits that leave the active rows as they were (a rewind's pointer commit is what
# changes them; its row commit deletes rows no pointer referenced any more).
NEUTRAL_OPERATIONS = frozenset({"recompute", "sweep", "reclaim", "rewind", *NO_DATA_OPERATIONS})
POINTER_KEY = ("bucket_start", "bucket_end", "entity_id", "generation")
_GLOBAL = "\x00every entity"  # a global pointer's entity in a join key (no entity id is this)


@dataclass(frozen=True)
class Published:
    """What a publish did: the versions the surface now reflects, whether it was rebuilt whole,
    in how many spans of changed buckets it replaced rows, and the rows it wrote."""

    rollup: str
    reflects: Reflected
    rebuilt: bool
    spans: int
    rows_written: int
    surface_version: int
    # When the oldest flip it brought to the surface was made (None: it brought none).
    oldest_flip: datetime | None = None

    @property
    def changed(self) -> bool:
        return self.rebuilt or self.spans > 0


def surface_schema(spec: RollupSpec) -> pa.Schema:
    """The surface's columns: the logical columns of a query, then the partition column."""
    logical = logical_arrow(data_schema(spec).empty_table(), spec).schema
    return logical.append(pa.field(PART_COLUMN, pa.string()))


def reflected(surface: DeltaTable | None) -> Reflected | None:
    """The versions the surface's rows are the active rows of (None: no surface, or one that
    never recorded them)."""
    if surface is None:
        return None
    g, r = surface.transaction_version(GENMAP_APP), surface.transaction_version(ROWS_APP)
    return None if g is None or r is None else Reflected(g, r)


def current_rows(
    engine: Engine,
    spec: RollupSpec,
    snap: Snapshot,
    window: Window,
) -> pa.Table | None:
    """What a query of `snap` returns for buckets starting in `window`, every entity: their
    logical rows, ordered by bucket start and entity, read from the surface when it holds exactly
    `snap`'s active rows (the versions it records are `snap`'s, or older by commits that leave
    the active rows as they were: `_still_current`). None when it does not (no surface, one
    lagging behind the rollup, one of other columns, or one that cannot be read): the caller
    resolves the active rows itself."""
    try:
        return _current_rows(engine, spec, snap, window)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.warning("%s: surface not readable (%s); resolving the pointers", spec.name, exc)
        return None


def _current_rows(
    engine: Engine, spec: RollupSpec, snap: Snapshot, window: Window
) -> pa.Table | None:
    uri, options = engine.rollups.surface_uri(spec), engine.warehouse.storage_options
    surface = open_table(uri, options)
    done = reflected(surface)
    if surface is None or done is None or not _still_current(engine, spec, done, snap.reflects):
        return None
    schema = surface_schema(spec)
    if [f.name for f in surface.schema().fields] != schema.names:
        return None
    logical = schema.remove(schema.get_field_index(PART_COLUMN))
    files = prune_files(
        file_actions(surface), time_column="bucket_start", spans=[window], entities=None
    )
    # Partitions name UTC days, months or years, and a publish writes each partition's new rows
    # in one file sorted by bucket start, then entity: read in partition order, the rows are
    # usually in query order already (checked; a compaction may have merged files).
    files.sort(
        key=lambda f: (
            str(f.get(f"partition.{PART_COLUMN}")),
            str(f.get("min.bucket_start")),
            f["path"],
        )
    )
    targets = [(window, None)]

    def read(f: dict) -> pa.Table:
        data = read_row_groups(uri, options, f["path"], logical.names, "bucket_start", targets)
        return data.filter(in_windows(data["bucket_start"], [window])).cast(logical)

    rows = pa.concat_tables([logical.empty_table(), *READERS.map(read, files)])
    if not _in_query_order(rows):
        rows = rows.sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
    return rows


# A query trusts a surface at most this many commits behind the rollup's tables (each one read to
# tell its kind); further behind, it resolves the pointers.
MAX_NEUTRAL_COMMITS = 16


def _still_current(engine: Engine, spec: RollupSpec, done: Reflected, now: Reflected) -> bool:
    """Do the commits after `done` up to `now` leave the active rows as they were? Told from their
    kinds alone: row-table commits that never change them (`NEUTRAL_OPERATIONS`: a recompute's
    invisible rows, sweeps, compaction, vacuum) and pointer-table commits that change no pointer
    (compaction, vacuum, checkpoints)."""
    if done == now:
        return True
    behind = (now.genmap - done.genmap) + (now.rows - done.rows)
    if done.genmap > now.genmap or done.rows > now.rows or behind > MAX_NEUTRAL_COMMITS:
        return False
    options = engine.warehouse.storage_options
    commits = [
        *(
            (engine.rollups.genmap_uri(spec), v, NO_DATA_OPERATIONS)
            for v in range(done.genmap + 1, now.genmap + 1)
        ),
        *(
            (engine.rollups.uri(spec), v, NEUTRAL_OPERATIONS)
            for v in range(done.rows + 1, now.rows + 1)
        ),
    ]
    for uri, version, neutral in commits:
        try:
            actions = read_commit(uri, version, options)
        except (OSError, ValueError):
            return False
        info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if (info.get("rollups.operation") or info.get("operation")) not in neutral:
            return False
    return True


def _in_query_order(rows: pa.Table) -> bool:
    """Are `rows` ordered by bucket start, then entity (as a query returns them)?"""
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


@dataclass(frozen=True)
class Known:
    """Active rows a writer already holds: at state `at` of the rollup, the cells in `cells`
    (entity, bucket start) have exactly the rows of `rows` (none: the cell is empty)."""

    rows: pa.Table  # entity_id, bucket_start, bucket_end and the partials
    cells: frozenset[tuple[str, datetime]]
    at: Reflected

    def covers(self, changed: "Changed", target: Reflected) -> bool:
        """Are these the target state's rows of every cell in `changed`?"""
        if target != self.at or changed.written:
            return False
        pairs = zip(
            changed.pointers["entity_id"].to_pylist(),
            changed.pointers["bucket_start"].to_pylist(),
            strict=True,
        )
        return all(e is not None and (e, t) in self.cells for e, t in pairs)


def publish(engine: Engine, spec: RollupSpec, known: Known | None = None) -> Published:
    """Bring the rollup's surface up to date with its active rows, in one commit (creating it,
    or rebuilding it whole, when what changed since it was written cannot be told). The rows
    of changed cells are read from the row table, unless `known` holds them (a recompute that
    just flipped them)."""
    uri = engine.rollups.surface_uri(spec)
    schema = surface_schema(spec)
    metadata: dict[str, str] = {"rollups.operation": "publish"}
    outcome: list[Published] = []

    def plan(surface: DeltaTable | None) -> CommitPlan:
        outcome.clear()
        snap = engine.rollups.snapshot(spec)
        target = snap.reflects
        done = reflected(surface)
        if surface is not None and done == target:
            outcome.append(Published(spec.name, target, False, 0, 0, surface.version()))
            return CommitPlan(adds=[])
        changed = (
            None if surface is None or done is None else changed_cells(engine, spec, done, target)
        )
        fits = known is not None and changed is not None and known.covers(changed, target)
        held = known.rows if fits and known is not None else None
        removes, adds, written = _replace(engine, spec, surface, changed, snap, schema, held)
        metadata["rollups.genmap_version"] = str(target.genmap)
        metadata["rollups.rows_version"] = str(target.rows)
        metadata["rollups.rebuilt"] = str(changed is None).lower()
        outcome.append(
            Published(
                spec.name,
                target,
                changed is None,
                0 if changed is None else len(changed.spans),
                written,
                -1,
                None if changed is None else changed.oldest_flip(snap.pointers),
            )
        )
        return CommitPlan(
            adds=adds,
            removes=removes,
            app_transactions=[(GENMAP_APP, target.genmap), (ROWS_APP, target.rows)],
        )

    version = commit(
        uri,
        plan,
        schema=schema,
        partition_by=[PART_COLUMN],
        metadata=metadata,
        storage_options=engine.warehouse.storage_options,
    )
    done = outcome[0]
    if done.changed:
        log.info(
            "%s: surface %s (%d row(s)) at pointer version %d, row version %d",
            spec.name,
            "rebuilt" if done.rebuilt else f"updated on {done.spans} changed span(s)",
            done.rows_written,
            done.reflects.genmap,
            done.reflects.rows,
        )
    metrics.surface_published(spec.name, done.oldest_flip)
    return replace(done, surface_version=version)


def publish_all(engine: Engine) -> list[Published]:
    """`publish` every rollup of the catalog that has been activated (has an archive state)."""
    states = engine.states.all()
    return [publish(engine, s) for s in engine.catalog.rollups.values() if s.name in states]


# -- what changed -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Changed:
    """The cells whose active rows may differ between two versions of a rollup: those of the
    pointers that differ (a global pointer: its bucket for every entity; an entity pointer: its
    cell), and every cell of the buckets in `written` (forward-lane commits)."""

    pointers: pa.Table  # (bucket_start, bucket_end, entity_id) of the differing pointers
    written: tuple[Window, ...]

    @cached_property
    def spans(self) -> list[Window]:
        """The merged bucket windows holding every changed cell."""
        starts = self.pointers["bucket_start"].to_pylist()
        ends = self.pointers["bucket_end"].to_pylist()
        return merge_windows(
            [*(Window(a, b) for a, b in zip(starts, ends, strict=True)), *self.written]
        )

    @cached_property
    def cells(self) -> Cells:
        """The changed cells, for reading the row groups that may hold them."""
        pairs = zip(
            self.pointers["bucket_start"].to_pylist(),
            self.pointers["bucket_end"].to_pylist(),
            self.pointers["entity_id"].to_pylist(),
            strict=True,
        )
        items = [(Window(a, b), None if e is None else frozenset([e])) for a, b, e in pairs]
        return Cells.collect([*items, *((w, None) for w in self.written)], limit=None)

    @cached_property
    def _starts(self) -> tuple[list[datetime], timedelta]:
        """The changed cells' bucket starts, in order, and how far before a span's start a
        bucket may begin and still overlap it (the longest bucket)."""
        windows = self.cells.windows
        longest = max((w.end - w.start for w in windows), default=timedelta(0))
        return [w.start for w in windows], longest

    def cells_within(self, spans: Sequence[Window]) -> Cells:
        """The changed cells whose buckets overlap `spans`."""
        starts, longest = self._starts
        items = self.cells.by_window
        picked: dict[int, None] = {}
        for span in spans:
            lo = bisect.bisect_left(starts, span.start - longest)
            hi = bisect.bisect_left(starts, span.end)
            for i in range(lo, hi):
                if items[i][0].overlaps(span):
                    picked[i] = None
        return Cells(tuple(items[i] for i in sorted(picked)))

    def oldest_flip(self, pointers: pa.Table) -> datetime | None:
        """When the oldest of the differing pointers still in `pointers` (the newer version's,
        with `flipped_at`) was flipped; None when there is none (pointers only dropped)."""
        if self.pointers.num_rows == 0:
            return None
        keys = list(POINTER_KEY)

        # Joins do not match null keys: a global pointer's entity is keyed as GLOBAL here.
        def keyed(t: pa.Table) -> pa.Table:
            entity = t.schema.get_field_index("entity_id")
            return t.set_column(entity, "entity_id", pc.fill_null(t["entity_id"], _GLOBAL))

        flips = keyed(pointers.select([*keys, "flipped_at"]))
        brought = keyed(self.pointers.select(keys)).join(flips, keys, join_type="inner")
        return pc.min(brought["flipped_at"]).as_py() if brought.num_rows else None

    def mask(self, rows: pa.Table) -> pa.ChunkedArray:
        """For rows with (bucket_start, entity_id): is each row's cell changed?"""
        mask = covered_mask(rows, self.pointers)
        if self.written:
            mask = pc.or_(mask, pc.fill_null(in_windows(rows["bucket_start"], self.written), False))
        return mask


def changed_cells(
    engine: Engine, spec: RollupSpec, done: Reflected, now: Reflected
) -> Changed | None:
    """The cells whose active rows may differ between the versions `done` and `now`; None when
    that cannot be told (then the surface is rebuilt whole)."""
    if done.genmap > now.genmap or done.rows > now.rows:
        return None  # the tables were re-created since
    moved = _pointers_at(engine, spec, -1)
    if done.genmap != now.genmap:
        found = _pointer_changes(engine, spec, done.genmap, now.genmap)
        if found is None:
            return None
        moved = found
    written: list[Window] = []
    for version in range(done.rows + 1, now.rows + 1):
        spans = _forward_buckets(engine, spec, version)
        if spans is None:
            return None
        written += spans
    return Changed(moved, tuple(merge_windows(written)))


def _pointers_at(engine: Engine, spec: RollupSpec, version: int) -> pa.Table:
    key = pa.schema([GENMAP_SCHEMA.field(c) for c in POINTER_KEY])
    if version < 0:
        return key.empty_table()
    table = open_table(engine.rollups.genmap_uri(spec), engine.warehouse.storage_options, version)
    if table is None:
        raise FileNotFoundError(f"no pointer table of '{spec.name}'")
    return pa.table(table.to_pyarrow_table()).select(key.names).cast(key)


def _pointer_changes(engine: Engine, spec: RollupSpec, old: int, new: int) -> pa.Table | None:
    """The pointers (bucket_start, bucket_end, entity_id, generation) in one of two
    pointer-table versions and not the other."""
    try:
        before, after = _pointers_at(engine, spec, old), _pointers_at(engine, spec, new)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.info("%s: pointer version %d is not readable (%s); rebuilding", spec.name, old, exc)
        return None
    return pa.concat_tables([_minus(before, after), _minus(after, before)])


def _minus(a: pa.Table, b: pa.Table) -> pa.Table:
    """Rows of `a` (pointer keys, no duplicates) that are not in `b`."""
    if a.num_rows == 0 or b.num_rows == 0:
        return a

    # Joins do not match null keys: a global pointer's entity is keyed as GLOBAL here.
    def keyed(t: pa.Table) -> pa.Table:
        return t.set_column(
            t.schema.get_field_index("entity_id"),
            "entity_id",
            pc.fill_null(t["entity_id"], _GLOBAL),
        )

    marked = keyed(b).append_column("__in_b", pa.array(np.ones(b.num_rows, dtype=bool)))
    joined = keyed(a).join(marked, list(POINTER_KEY), join_type="left outer")
    kept = joined.filter(pc.is_null(joined["__in_b"])).drop_columns(["__in_b"])
    entity = kept["entity_id"]
    restored = pc.if_else(pc.equal(entity, _GLOBAL), pa.scalar(None, pa.string()), entity)
    return (
        kept.set_column(kept.schema.get_field_index("entity_id"), "entity_id", restored)
        .select(list(POINTER_KEY))
        .cast(a.schema)
    )


def _forward_buckets(engine: Engine, spec: RollupSpec, version: int) -> list[Window] | None:
    """Buckets whose active rows row-table commit `version` changed ([] for none); None when it
    cannot be told."""
    try:
        actions = read_commit(engine.rollups.uri(spec), version, engine.warehouse.storage_options)
    except (OSError, ValueError) as exc:
        log.info("%s: row commit %d is not readable (%s); rebuilding", spec.name, version, exc)
        return None
    info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    operation = info.get("rollups.operation") or info.get("operation")
    if operation in NEUTRAL_OPERATIONS:
        return []
    if operation not in FORWARD_OPERATIONS:
        log.info(
            "%s: row commit %d (%s) is not a known kind; rebuilding", spec.name, version, operation
        )
        return None
    # The buckets the commit replaced, written or emptied (a bucket that lost all its source
    # rows gets no file, only removes).
    replaced = info.get(REPLACED_KEY)
    if replaced is None:
        return None
    out = [Window(_instant(a), _instant(b)) for a, b in json.loads(replaced)]
    for action in actions:
        add = action.get("add")
        if add is None:
            continue
        stats = json.loads(add.get("stats") or "{}")
        lo = stats.get("minValues", {}).get("bucket_start")
        hi = stats.get("maxValues", {}).get("bucket_end")
        if lo is None or hi is None:
            return None
        out.append(Window(_instant(lo), _instant(hi)))
    return out


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


# -- writing -------------------------------------------------------------------------------------


def _active_rows(
    engine: Engine,
    spec: RollupSpec,
    snap: Snapshot,
    spans: Sequence[Window] | None,
    changed: Changed | None,
    schema: pa.Schema,
    held: pa.Table | None = None,
) -> pa.Table:
    """The snapshot's active rows in `spans` (None: all), of the `changed` cells only (None:
    every cell), in the surface's columns: taken from `held` when given (the changed cells'
    active rows, which a writer holds), otherwise read (only the row groups that may hold a
    changed cell)."""
    if spans is not None and not spans:
        return schema.empty_table()
    needed = ["entity_id", "bucket_start", "bucket_end", *(c.name for c in spec.stored_columns)]
    if held is not None and spans is not None:
        rows = held.select(needed)
        rows = rows.filter(pc.fill_null(in_windows(rows["bucket_start"], spans), False))
    else:
        cells = None if changed is None or spans is None else changed.cells_within(spans)
        rows = engine.rollups.read_arrow(spec, spans, snapshot=snap, columns=needed, cells=cells)
    if changed is not None:
        rows = rows.filter(changed.mask(rows))
    logical = logical_arrow(rows, spec)
    return logical.append_column(PART_COLUMN, part_values(spec, logical["bucket_start"])).cast(
        schema
    )


# Batches rewritten side by side (each holds one batch's rows in memory).
PUBLISH_WORKERS = max(1, min(4, os.cpu_count() or 1))
# Partitions of the surface rewritten per batch: a publish reads and writes one batch at a time
# (and commits them all at once), so a wave that touches every partition never holds the whole
# rollup in memory.
PARTS_PER_BATCH = 16


def _replace(
    engine: Engine,
    spec: RollupSpec,
    surface: DeltaTable | None,
    changed: Changed | None,
    snap: Snapshot,
    schema: pa.Schema,
    held: pa.Table | None = None,
) -> tuple[list, list, int]:
    """Remove actions for the surface files holding rows of `changed` cells (every file:
    None), add actions for files holding their other rows plus the snapshot's active rows of
    those cells (`held`, when a writer holds them; one file per partition), and how many
    active rows were written."""
    uri = engine.rollups.surface_uri(spec)
    options = engine.warehouse.storage_options
    fs, root = filesystem_for(uri, options)
    files = [] if surface is None else file_actions(surface)
    removes = [remove_action(f) for f in files] if changed is None else []
    reading = _row_span(snap) if changed is None else changed.spans
    names = schema.names[:-1]
    data_schema_ = schema.remove(schema.get_field_index(PART_COLUMN))

    def one(batch: list[Window]) -> tuple[list, list, int]:
        """The batch's surface files rewritten: (removes, adds, active rows written)."""
        rows = _active_rows(engine, spec, snap, batch, changed, schema, held)
        pieces, gone, made = [rows], [], []
        if changed is not None:
            for f in prune_files(files, time_column="bucket_start", spans=batch, entities=None):
                data = read_row_groups(uri, options, f["path"], names, "bucket_start", None)
                drop = pc.fill_null(
                    pc.and_(in_windows(data["bucket_start"], batch), changed.mask(data)), False
                )
                if not pc.any(drop).as_py():
                    continue
                gone.append(remove_action(f))
                keep = data.filter(pc.invert(drop))
                if keep.num_rows:
                    part = pa.array([str(f[f"partition.{PART_COLUMN}"])] * keep.num_rows)
                    pieces.append(keep.append_column(PART_COLUMN, part).cast(schema))
        table = pa.concat_tables(pieces).sort_by(
            [(PART_COLUMN, "ascending"), ("bucket_start", "ascending"), ("entity_id", "ascending")]
        )
        for part, piece in _by_partition(table):
            directory = urllib.parse.unquote(partition_dir(PART_COLUMN, part))
            data = piece.drop_columns([PART_COLUMN]).cast(data_schema_)
            made.append(add_action(write_file(fs, root, directory, data, {PART_COLUMN: part})))
        return gone, made, rows.num_rows

    # Batches hold disjoint partitions (a surface file lies in one): they are rewritten side by
    # side, since reading, sorting and writing Parquet release the GIL.
    adds, written = [], 0
    batches = _batches(spec, reading)
    with ThreadPoolExecutor(max_workers=min(PUBLISH_WORKERS, len(batches) or 1)) as pool:
        for gone, made, n in pool.map(one, batches):
            removes += gone
            adds += made
            written += n
    return removes, adds, written


def _row_span(snap: Snapshot) -> list[Window]:
    """The bucket starts the snapshot's row table holds, from its files' statistics (none for
    an empty or missing table)."""
    if snap.table is None:
        return []
    files = file_actions(snap.table)
    if not files:
        return []
    starts = [f.get("min.bucket_start") for f in files]
    ends = [f.get("max.bucket_start") for f in files]
    lo = [t for t in starts if isinstance(t, datetime)]
    hi = [t for t in ends if isinstance(t, datetime)]
    if len(lo) < len(files) or len(hi) < len(files):
        return [Window(as_utc(FAR_PAST), as_utc(FAR_FUTURE))]
    return [Window(as_utc(min(lo)), as_utc(max(hi)) + timedelta(microseconds=1))]


def _batches(spec: RollupSpec, spans: Sequence[Window]) -> list[list[Window]]:
    """`spans` cut at surface partition boundaries, in batches of up to `PARTS_PER_BATCH`
    partitions (a span without finite ends is one batch)."""
    far = as_utc(FAR_PAST), as_utc(FAR_FUTURE)
    if any(w.start <= far[0] or w.end >= far[1] for w in spans):
        return [list(spans)]
    cut: dict[datetime, list[Window]] = {}
    for w in merge_windows(list(spans)):
        start = storage_partition(spec, w.start).start
        while start < w.end:
            end = storage_partition(spec, start).end
            cut.setdefault(start, []).append(Window(max(w.start, start), min(w.end, end)))
            start = end
    parts = sorted(cut)
    return [
        [w for p in parts[i : i + PARTS_PER_BATCH] for w in cut[p]]
        for i in range(0, len(parts), PARTS_PER_BATCH)
    ]


def _by_partition(table: pa.Table) -> list[tuple[str, pa.Table]]:
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
