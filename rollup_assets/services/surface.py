"""The surface: a Delta table of each rollup's active rows, for readers outside this project
(and for this project's own reads of every entity: `surface_reads.rows_now`).

A rollup's row table (`rollups/<rollup>/`) holds every generation, and its pointer table says
which one is active; a plain Delta reader (delta-rs, DuckDB, Polars, Trino, Databricks SQL)
knows nothing of the pointers and would count a corrected cell once per generation kept. The
surface, `rollups/<rollup>__active/`, holds exactly the active rows, in the logical columns a
query returns (`entity_id`, `bucket_start`, `bucket_end`, one column per aggregation; an
average as its value), `bucket_part`, the UTC day, month or year of `bucket_start` it is
partitioned by (the row table's physical partitioning), and each average's sum and count, from
which buckets merge exactly into coarser steps (`surface_layout.surface_schema`).

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
it: a query, and a downsampling of every entity, read the surface only while it is current
(`surface_reads`).

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

import pyarrow as pa
from deltalake import DeltaTable

from rollup_assets import metrics
from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.faults import checkpoint
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import RollupSpec
from rollup_assets.resources.delta_commits import CommitPlan, commit
from rollup_assets.resources.memory import returning_memory
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.schemas import PART_COLUMN
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import Changed, changed_cells
from rollup_assets.services.surface_files import rewrite
from rollup_assets.services.surface_layout import FORMAT, FORMAT_APP, surface_schema
from rollup_assets.services.surface_reads import GENMAP_APP, ROWS_APP, reflected

log = logging.getLogger(__name__)

# What other modules import from here (the changes between two states have their own module).
__all__ = [
    "GENMAP_APP",
    "ROWS_APP",
    "Changed",
    "Known",
    "Published",
    "changed_cells",
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
            instants_of(changed.pointers["bucket_start"]),
            strict=True,
        )
        return all(e is not None and (e, t) in self.cells for e, t in pairs)


@returning_memory
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
            app_transactions=[
                (GENMAP_APP, target.genmap),
                (ROWS_APP, target.rows),
                (FORMAT_APP, FORMAT),
            ],
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
