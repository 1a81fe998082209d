"""A rollup table's location and its row rewrites: sweeps, reclaims, rewinds and retention.

A rollup table holds rows of every generation. Rows leave it only by a file rewrite: each file
holding rows to drop is removed and its other rows are written to a new file, all in one commit
(readers keep their snapshot meanwhile). What may go is one rule (`model.keeping`): a sweep drops
what a flip superseded (never before the flip, and not while a pointer of the cell is younger
than the generation retention: as-of reads and rollbacks find the superseded rows meanwhile); a
reclaim drops generations that were never flipped (left by runs that died before their flip); a
rewind drops recomputed rows after a watermark it moves back, once it has dropped their pointers
(moving the rollup's fence); retention drops every row (base and difference rows of every
generation) of the buckets before the instant the rollup keeps from, once it has dropped their
pointers (recording that instant and moving the fence).
"""

import json
import logging
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.transaction import AddAction, RemoveAction

from rollup_assets.model.cells import Cells
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.operations import OPERATION_KEY, Operation
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, iso_utc, merge_windows, micros
from rollup_assets.resources.delta_commits import CommitPlan, commit, remove_action
from rollup_assets.resources.delta_files import (
    ROW_GROUP_ROWS,
    TargetIndex,
    Targets,
    add_action,
    read_row_groups,
    write_file,
)
from rollup_assets.resources.delta_tables import file_actions, open_table, prune_files, read_commit
from rollup_assets.resources.flips import flipped_since
from rollup_assets.resources.genmap import (
    RETAINED_APP,
    read_pointers,
    retained_mark,
    write_pointer_table,
)
from rollup_assets.resources.schemas import PART_COLUMN, TS, data_schema, table_schema
from rollup_assets.resources.visible_rows import covered_mask, visible_mask
from rollup_assets.resources.warehouse import Warehouse, filesystem_for

log = logging.getLogger(__name__)
# A recompute's sweep leaves superseded rows in files this much larger than what it wrote (and
# larger than SWEEP_MIN_ROWS) to the maintenance sweep; see RollupTable.sweep.
SWEEP_FACTOR = 8
SWEEP_MIN_ROWS = 4_096
# The commit metadata key of a forward commit's replaced bucket spans (a JSON list of
# [start, end] ISO pairs); a retention commit of the row table records the same.
REPLACED_KEY = "rollups.replaced"


def in_windows(starts: pa.ChunkedArray | pa.Array, windows: Sequence[Window]) -> pa.ChunkedArray:
    """Mask: does each bucket start fall in one of `windows`? (Null for a null start.) One
    binary search per row over the merged windows, however many there are."""
    merged = merge_windows(list(windows))
    values = pc.cast(starts, TS)
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    at = pc.fill_null(values.cast(pa.int64()), 0).to_numpy(zero_copy_only=False)
    lo = np.array([micros(w.start) for w in merged], dtype=np.int64)
    hi = np.array([micros(w.end) for w in merged], dtype=np.int64)
    i = np.searchsorted(lo, at, side="right") - 1
    inside = (i >= 0) & (at < hi[np.clip(i, 0, None)]) if len(merged) else i >= 0
    nulls = values.is_null().to_numpy(zero_copy_only=False) if values.null_count else None
    return pa.chunked_array([pa.array(inside, pa.bool_(), mask=nulls)])


def cell_keys(cells: Cells) -> pa.Table:
    """The named cells of `cells` as (bucket_start, entity_id) rows."""
    named = [(w.start, e) for w, scope in cells for e in sorted(scope or ())]
    return pa.table(
        {
            "bucket_start": pa.array([start for start, _ in named], TS),
            "entity_id": pa.array([e for _, e in named], pa.string()),
        }
    )


@dataclass(frozen=True)
class Written:
    adds: list[AddAction]
    rows: int
    # Per bucket start: (cells written, source rows behind them), when the writer counted them.
    counts: dict[datetime, tuple[int, int]] = field(default_factory=dict)
    # Source rows the executors decoded outside Spark's scans to write them (a first fill).
    rows_read: int = 0


class RollupTable:
    """Where a rollup's rows and pointers live, and how rows are dropped from it."""

    def __init__(
        self, warehouse: Warehouse, generation_retention: timedelta = timedelta(0)
    ) -> None:
        self.warehouse = warehouse
        self.options = warehouse.storage_options
        # Which superseded rows stay (a pointer of their cell younger than the retention).
        self.keeping = Keeping(generation_retention)

    def uri(self, spec: RollupSpec) -> str:
        return self.warehouse.rollup_path(spec.name)

    def genmap_uri(self, spec: RollupSpec) -> str:
        return self.warehouse.genmap_path(spec.name)

    def surface_uri(self, spec: RollupSpec) -> str:
        return self.warehouse.surface_path(spec.name)

    def drop(self, spec: RollupSpec) -> None:
        """Delete the rollup's surface, row and pointer tables (a deleted archive). The surface
        goes first: left behind by a crash, it could record versions a re-created rollup reaches."""
        self.warehouse.drop_table(self.surface_uri(spec))
        self.warehouse.drop_table(self.uri(spec))
        self.warehouse.drop_table(self.genmap_uri(spec))

    def commit(
        self,
        spec: RollupSpec,
        plan: Callable[[DeltaTable | None], CommitPlan],
        metadata: dict[str, str],
    ) -> int:
        """Commit `plan(snapshot)` to the rollup's row table; its new version."""
        return commit(
            self.uri(spec),
            plan,
            schema=table_schema(spec),
            partition_by=[PART_COLUMN],
            metadata=metadata,
            storage_options=self.options,
        )

    def overlapping(
        self, files: list[dict], spans: Sequence[Window] | None, entities: frozenset[str] | None
    ) -> list[dict]:
        """Files whose stats say they may hold rows in `spans` (and `entities`)."""
        return prune_files(files, time_column="bucket_start", spans=spans, entities=entities)

    def _read_file(
        self,
        spec: RollupSpec,
        f: dict,
        columns: Sequence[str] | None = None,
        targets: Targets | TargetIndex | None = None,
    ) -> pa.Table:
        """The file's rows (its `columns`); with `targets`, only the row groups whose statistics
        say they may hold rows of them (`delta_files.read_row_groups`)."""
        return read_row_groups(
            self.uri(spec), self.options, f["path"], columns, "bucket_start", targets
        )

    def committed_rows(
        self, spec: RollupSpec, version: int, spans: Sequence[Window], columns: Sequence[str]
    ) -> pa.Table:
        """The `columns` of the rows that commit `version` of the row table added, of buckets
        starting in `spans` (whatever generation they carry)."""
        added = [a["add"] for a in read_commit(self.uri(spec), version, self.options) if "add" in a]
        wanted = [*columns, *(["bucket_start"] if "bucket_start" not in columns else [])]
        schema = pa.schema([data_schema(spec).field(c) for c in wanted])
        parts = [self._read_file(spec, f, wanted).cast(schema) for f in added]
        rows = pa.concat_tables(parts) if parts else schema.empty_table()
        return rows.filter(in_windows(rows["bucket_start"], spans)).select(list(columns))

    # -- sweeping ------------------------------------------------------------------------------

    def sweep(
        self,
        spec: RollupSpec,
        buckets: Sequence[Window],
        entities: frozenset[str] | None,
        *,
        flipped: Written | None = None,
        generation: int | None = None,
        up_to: int | None = None,
    ) -> int:
        """Delete rows in `buckets` (for `entities`) that are not the active generation, once
        the generation retention has passed since the newest flip of their cell (a row whose
        cell a pointer younger than it covers stays: as-of reads and rollbacks need it).

        With `up_to`, rows of a newer generation stay: a caller that holds no writer's lock (the
        maintenance sweep) passes the newest generation its pointers know, since a newer one is
        a recompute's, committed but not flipped yet.

        After a recompute's flip, pass its `generation` and what it wrote (`flipped`): files
        holding only that generation have nothing superseded and are not read, and a file much
        larger than the change (more than `SWEEP_FACTOR` times the rows written and more than
        `SWEEP_MIN_ROWS`) keeps its superseded rows, invisible to readers, until the
        maintenance sweep: rewriting it would make a small correction cost what the archive
        costs. Without them every file holding superseded rows in `buckets` is rewritten.
        """
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        recent = None
        if self.keeping.keeps:
            cutoff = self.keeping.cutoff(datetime.now(UTC))
            recent = flipped_since(pointers, cutoff)
            inside = pc.fill_null(in_windows(pointers["bucket_start"], buckets), False)
            older = pointers.filter(
                pc.and_(inside, pc.less_equal(pointers["flipped_at"], pa.scalar(cutoff, TS)))
            )
            if older.num_rows == 0:
                return 0  # every pointer of these buckets is younger than the retention
        limit = None
        if flipped is not None:
            limit = max(SWEEP_MIN_ROWS, SWEEP_FACTOR * flipped.rows)

        def select(files: list[dict]) -> list[dict]:
            candidates = [
                f
                for f in self.overlapping(files, buckets, entities)
                if not (
                    generation is not None
                    and f.get("min.generation") == generation
                    and f.get("max.generation") == generation
                )
            ]
            chosen = [
                f for f in candidates if limit is None or (f.get("num_records") or 0) <= limit
            ]
            if len(chosen) < len(candidates):
                log.info(
                    "%s: %d file(s) larger than %d rows keep their superseded rows until the "
                    "maintenance sweep",
                    spec.name,
                    len(candidates) - len(chosen),
                    limit,
                )
            return chosen

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            mask = pc.and_(
                in_windows(rows["bucket_start"], buckets), pc.invert(visible_mask(rows, pointers))
            )
            if recent is not None:
                mask = pc.and_(mask, pc.invert(covered_mask(rows, recent)))
            if entities is not None:
                mask = pc.and_(
                    mask, pc.is_in(rows["entity_id"], value_set=pa.array(sorted(entities)))
                )
            return _at_most(mask, rows, up_to)

        return self._delete_rows(spec, select, drop, {OPERATION_KEY: Operation.SWEEP})

    def reclaim(
        self, spec: RollupSpec, *, flipped: frozenset[int], up_to: int | None = None
    ) -> int:
        """Delete rows of generations that were never flipped (left by runs that died before
        their flip) and that no pointer names: `flipped` holds every generation a job of the
        rollup flipped, however long ago (superseded ones are the sweep's, under the retention
        rule). With `up_to`, only generations up to it: see `sweep`. Without it, call it only
        while holding the rollup's writer slot (a recompute does, before it writes)."""
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        named = {*pc.unique(pointers["generation"]).to_pylist(), *flipped}

        def gone(g: int) -> bool:
            return Keeping.reclaimable(g, named) and (up_to is None or g <= up_to)

        def select(files: list[dict]) -> list[dict]:
            return [
                f
                for f in files
                if f.get("min.generation") is None
                or any(gone(g) for g in range(f["min.generation"], f["max.generation"] + 1))
            ]

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            present = pc.unique(rows["generation"]).to_pylist()
            doomed = pa.array(sorted(g for g in present if g is not None and gone(g)), pa.int64())
            return pc.is_in(rows["generation"], value_set=doomed)

        return self._delete_rows(spec, select, drop, {OPERATION_KEY: Operation.RECLAIM})

    def drop_pointers_from(
        self, spec: RollupSpec, boundary: datetime, *, job_id: str
    ) -> int | None:
        """A rewind's first effect: drop the pointers of buckets starting at/after `boundary` in
        one commit that moves the rollup's fence (a recompute that read it before cannot flip
        there any more). Returns the pointer table's version (None: the rollup has none)."""
        if open_table(self.genmap_uri(spec), self.options) is None:
            return None
        b = pa.scalar(boundary, TS)
        return write_pointer_table(
            self.genmap_uri(spec),
            lambda cur: cur.filter(pc.less(cur["bucket_start"], b)),
            metadata={OPERATION_KEY: Operation.REWIND, "rollups.job_id": job_id},
            storage_options=self.options,
            move=True,
        )

    def delete_recomputed_from(self, spec: RollupSpec, boundary: datetime) -> int:
        """A rewind's second effect: delete every row of a generation above 0 in buckets
        starting at/after `boundary` (their pointers are gone; until the forward lane
        aggregates the range again, readers see its generation-0 rows). Returns the rows
        deleted."""
        b = pa.scalar(boundary, TS)

        def select(files: list[dict]) -> list[dict]:
            return [
                f
                for f in files
                if f.get("max.bucket_start") is None
                or (f["max.bucket_start"] >= boundary and (f.get("max.generation") or 1) > 0)
            ]

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.and_(
                pc.greater_equal(rows["bucket_start"], b), pc.greater(rows["generation"], 0)
            )

        return self._delete_rows(spec, select, drop, {OPERATION_KEY: Operation.REWIND})

    # -- retention -----------------------------------------------------------------------------

    def pointers_retained_from(self, spec: RollupSpec) -> datetime | None:
        """The instant before which retention dropped every pointer of the rollup, as its
        pointer table records it (None: it never did)."""
        mark = retained_mark(open_table(self.genmap_uri(spec), self.options))
        return datetime.fromtimestamp(mark / 1e6, UTC) if mark else None

    def drop_pointers_before(self, spec: RollupSpec, cut: datetime) -> int | None:
        """Retention's first effect: drop the pointers of buckets starting before `cut` in one
        commit that records `cut` (`RETAINED_APP`) and moves the rollup's fence, so a recompute
        that read the fence before can no longer flip there. Nothing is committed when the table
        records `cut` (or later) already. Returns the commit's version (None: none)."""
        kept = self.pointers_retained_from(spec)
        if kept is not None and kept >= cut:
            return None
        b = pa.scalar(cut, TS)
        return write_pointer_table(
            self.genmap_uri(spec),
            lambda cur: cur.filter(pc.greater_equal(cur["bucket_start"], b)),
            metadata={
                OPERATION_KEY: Operation.RETENTION,
                "rollups.retained_from": iso_utc(cut),
            },
            storage_options=self.options,
            move=True,
            marks=[(RETAINED_APP, micros(cut))],
        )

    def delete_before(self, spec: RollupSpec, cut: datetime) -> int:
        """Retention's second effect, once the pointers are gone: delete every row of a bucket
        starting before `cut` (base and difference rows, of every generation) in one commit,
        which records the buckets from the first stored one to `cut` as replaced:
        generation-0 rows were visible without a pointer, so the surface's publish learns that
        those cells changed. Returns the rows deleted (no commit when none)."""
        table = open_table(self.uri(spec), self.options)
        files = file_actions(table) if table is not None else []
        starts = [f.get("min.bucket_start") for f in files]
        first = min((t for t in starts if t is not None), default=cut)
        if first >= cut and None not in starts:
            return 0  # nothing stored before the cut
        b = pa.scalar(cut, TS)

        def select(files: list[dict]) -> list[dict]:
            return [
                f for f in files if f.get("min.bucket_start") is None or f["min.bucket_start"] < cut
            ]

        def drop(rows: pa.Table) -> pa.ChunkedArray:
            return pc.less(rows["bucket_start"], b)

        metadata = {
            OPERATION_KEY: Operation.RETENTION,
            "rollups.retained_from": iso_utc(cut),
            REPLACED_KEY: json.dumps([[iso_utc(first), iso_utc(cut)]]),
        }
        return self._delete_rows(spec, select, drop, metadata)

    def _delete_rows(
        self,
        spec: RollupSpec,
        select: Callable[[list[dict]], list[dict]],
        drop: Callable[[pa.Table], pa.ChunkedArray],
        metadata: dict[str, str],
    ) -> int:
        if open_table(self.uri(spec), self.options) is None:
            return 0
        deleted = [0]

        def plan(snapshot: DeltaTable | None) -> CommitPlan:
            removes, adds, n = self._rewrite(spec, snapshot, select, drop)
            deleted[0] = n
            return CommitPlan(adds=adds, removes=removes)

        self.commit(spec, plan, metadata)
        return deleted[0]

    def _rewrite(
        self,
        spec: RollupSpec,
        snapshot: DeltaTable | None,
        select: Callable[[list[dict]], list[dict]],
        drop: Callable[[pa.Table], pa.ChunkedArray],
    ) -> tuple[list[RemoveAction], list[AddAction], int]:
        """Remove the selected files that hold rows matching `drop`; rewrite their other rows."""
        if snapshot is None:
            return [], [], 0
        fs, root = filesystem_for(self.uri(spec), self.options)
        schema = data_schema(spec)
        removes: list[RemoveAction] = []
        adds: list[AddAction] = []
        dropped = 0
        for f in select(file_actions(snapshot)):
            rows = self._read_file(spec, f, schema.names).cast(schema)
            mask = pc.fill_null(drop(rows), False)
            n = pc.sum(mask.cast(pa.int64())).as_py() or 0
            if n == 0:
                continue
            dropped += n
            removes.append(remove_action(f))
            if n == rows.num_rows:
                continue
            keep = rows.filter(pc.invert(mask))
            path = urllib.parse.unquote(f["path"])
            directory = path.rsplit("/", 1)[0] + "/" if "/" in path else ""
            pv = {k.split(".", 1)[1]: v for k, v in f.items() if k.startswith("partition.")}
            adds.append(
                add_action(
                    write_file(
                        fs,
                        root,
                        directory,
                        keep,
                        {k: None if v is None else str(v) for k, v in pv.items()},
                        row_group_rows=ROW_GROUP_ROWS,
                    )
                )
            )
        return removes, adds, dropped


def _at_most(mask: pa.ChunkedArray, rows: pa.Table, generation: int | None) -> pa.ChunkedArray:
    """`mask`, limited to rows of `generation` or older (no limit: None)."""
    if generation is None:
        return mask
    return pc.and_(mask, pc.less_equal(rows["generation"], generation))
