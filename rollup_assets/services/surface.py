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
commit. Active rows change in two ways only (`surface_changes`): a pointer commit (a flip, a
rewind, a rollback) changes the cells of the pointers that differ between the recorded pointer
version and now; a forward-lane commit of the row table (generation-0 rows replaced in place)
changes the buckets it replaced. Every other row-table commit (a recompute's invisible rows,
sweeps, reclaims, compaction) leaves the active rows as they were. When the changes cannot be
worked out (no surface yet, an old
version whose log or files are gone, e.g. after a restore, a commit of a kind not listed above,
or recorded versions newer than the tables, i.e. a re-created rollup) the surface is rebuilt
whole, still in one commit.

Atomicity. A flip (or forward commit) and the surface commit are two Delta commits. A plain
reader between them sees the surface's previous state: every row active as of the previous
flip, consistent in itself. The runs that flip or write do not publish: the surface publish
sensor (`rollup_assets.sensors.surface_plan`) sees from the logs that the surface lags
(`surface_lag`) and launches one publish run for the lagging rollups, each at most every half of
`ROLLUPS_SURFACE_MAX_LAG_SECONDS`, so a plain reader is at most that far behind the last flip
and a stream of corrections coalesces into few publishes. Since a surface says what it reflects,
any publish repairs whatever it lags by: maintenance publishes every rollup, the asset check the
rollup it checks, a rewind and a rollback the rollup they changed, a restore every rollup, and
`rollups publish` on demand. A surface missing for an existing rollup (an archive created before
surfaces existed) is built whole by the first of these. The project's own reads never wait for
it: a query reads the surface only while it is current (`current_rows`).

Cost. The surface is partitioned like the row table (by UTC day below a day, month for days,
year above), and each partition is written as files of whole entities by entity range, of at
most `SURFACE_FILE_ROWS` rows (`surface_layout`). A publish rewrites only the files that hold a
changed cell or take a new one (their other rows are carried over, `surface_files.rewrite`): a
one-cell correction rewrites one file of each level, whatever the number of entities; a bucket
changed for every entity rewrites its partition. The changed cells' rows are read from the row
table, or taken from a writer that holds them (`Known`).

Concurrency. One writer runs per rollup, but maintenance, checks and a manual publish may
publish at the same time. A publish commits through `delta_commits.commit`: on a conflict (a
concurrent publish records the same application ids; a compaction removed a file it rewrites)
it is planned again from fresh snapshots. Every plan is a pure function of the surface snapshot
it was given and the rollup snapshot it then takes, so whichever publish lands last, the
surface holds the rows of the versions it records, and a publish that lands with older versions
than the newest leaves a lag the next publish repairs.
"""

import logging
from dataclasses import dataclass, replace
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from rollup_assets import metrics
from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.faults import checkpoint
from rollup_assets.model.operations import (
    NO_DATA_OPERATIONS,
    OPERATION_KEY,
    Operation,
    operation_of,
)
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_commits import CommitPlan, commit
from rollup_assets.resources.delta_files import read_row_groups
from rollup_assets.resources.delta_tables import file_actions, open_table, prune_files, read_commit
from rollup_assets.resources.rollup_reads import READERS
from rollup_assets.resources.rollup_snapshots import Reflected, Snapshot
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import PART_COLUMN, data_schema
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import NEUTRAL_OPERATIONS, Changed, changed_cells
from rollup_assets.services.surface_files import rewrite
from rollup_assets.services.surface_layout import in_entity_order, in_query_order

log = logging.getLogger(__name__)

# Application transactions of a surface commit: the versions of the rollup's tables it reflects.
GENMAP_APP = "rollups.surface.genmap"
ROWS_APP = "rollups.surface.rows"
# What other modules import from here (the changes between two states have their own module).
__all__ = [
    "GENMAP_APP",
    "ROWS_APP",
    "Changed",
    "Known",
    "Published",
    "changed_cells",
    "current_rows",
    "publish",
    "publish_all",
    "reflected",
    "surface_schema",
]


@dataclass(frozen=True)
class Published:
    """What a publish did: the versions the surface now reflects, whether it was rebuilt whole,
    in how many spans of changed buckets it replaced rows, the active rows of changed cells it
    wrote, and its whole cost: surface rows read (the files it rewrote), rows and bytes written
    (those files again, carried-over rows included), files removed and added."""

    rollup: str
    reflects: Reflected
    rebuilt: bool
    spans: int
    rows_written: int
    surface_version: int
    surface_rows_read: int = 0
    file_rows_written: int = 0
    bytes_written: int = 0
    files_removed: int = 0
    files_added: int = 0
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
    # Partitions name UTC days, months or years (their names sort in time order), and a publish
    # writes a partition's rows as files of disjoint entity ranges, each ordered by bucket start,
    # then entity: read in entity order, a partition's files merge into query order on bucket
    # start alone (checked: a file of unknown or overlapping range would break it).
    parts: dict[str, list[dict]] = {}
    for f in files:
        parts.setdefault(str(f.get(f"partition.{PART_COLUMN}")), []).append(f)
    ordered = [in_entity_order(parts[p]) for p in sorted(parts)]
    targets = [(window, None)]

    def read(f: dict) -> pa.Table:
        data = read_row_groups(uri, options, f["path"], logical.names, "bucket_start", targets)
        return data.filter(in_windows(data["bucket_start"], [window])).cast(logical)

    tables = iter(READERS.map(read, [f for group in ordered for f in group]))
    merged = [in_query_order([next(tables) for _ in group]) for group in ordered]
    rows = pa.concat_tables([logical.empty_table(), *merged])
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
        if operation_of(info) not in neutral:
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
    metadata: dict[str, str] = {OPERATION_KEY: Operation.PUBLISH}
    outcome: list[Published] = []

    def plan(surface: DeltaTable | None) -> CommitPlan:
        outcome.clear()
        snap = engine.rollups.snapshot(spec)
        target = snap.reflects
        recorded = reflected(surface)
        if surface is not None and recorded == target:
            outcome.append(Published(spec.name, target, False, 0, 0, surface.version()))
            return CommitPlan(adds=[])
        changed = (
            None
            if surface is None or recorded is None
            else changed_cells(engine, spec, recorded, target)
        )
        fits = known is not None and changed is not None and known.covers(changed, target)
        held = known.rows if fits and known is not None else None
        done = rewrite(engine, spec, surface, changed, snap, schema, held)
        checkpoint("publish_written", spec.name)
        metadata["rollups.genmap_version"] = str(target.genmap)
        metadata["rollups.rows_version"] = str(target.rows)
        metadata["rollups.rebuilt"] = str(changed is None).lower()
        outcome.append(
            Published(
                spec.name,
                target,
                changed is None,
                0 if changed is None else len(changed.spans),
                done.active_rows,
                -1,
                done.surface_rows_read,
                done.rows_written,
                done.bytes_written,
                len(done.removes),
                len(done.adds),
                None if changed is None else changed.oldest_flip(snap.pointers),
            )
        )
        return CommitPlan(
            adds=done.adds,
            removes=done.removes,
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
    metrics.surface_published(spec.name, done.oldest_flip)
    if done.changed:
        log.info(
            "%s: surface %s (%d active row(s); %d file(s) replaced by %d, %d row(s) read, "
            "%d written) at pointer version %d, row version %d",
            spec.name,
            "rebuilt" if done.rebuilt else f"updated on {done.spans} changed span(s)",
            done.rows_written,
            done.files_removed,
            done.files_added,
            done.surface_rows_read,
            done.file_rows_written,
            done.reflects.genmap,
            done.reflects.rows,
        )
    return replace(done, surface_version=version)


def publish_all(engine: Engine) -> list[Published]:
    """`publish` every rollup of the catalog that has been activated (has an archive state)."""
    states = engine.states.all()
    return [publish(engine, s) for s in engine.catalog.rollups.values() if s.name in states]
