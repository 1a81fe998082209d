"""Rows leaving a rollup table: sweeps, reclaims, rewinds and retention.

What may go is one rule (`model.keeping`): a sweep drops what a flip superseded (never before
the flip, and not while a pointer of the cell is younger than the generation retention: as-of
reads and rollbacks find the superseded rows meanwhile); a reclaim drops generations that were
never flipped (left by runs that died before their flip); a rewind drops recomputed rows after a
watermark it moves back, once it has dropped their pointers (moving the rollup's fence:
`rollup_pointers`); retention drops every row (base and difference rows of every generation) of
the buckets before the instant the rollup keeps from, once it has dropped their pointers
(recording that instant and moving the fence). Every drop is one file rewrite
(`RollupTable._rewrite`).
"""

import functools
import json
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable

from rollup_assets.compute.window_bounds import WindowBounds
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.operations import OPERATION_KEY, RETAINED_FROM_KEY, Operation
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, iso_utc
from rollup_assets.resources.delta_commits import CommitPlan
from rollup_assets.resources.delta_tables import file_actions, open_table
from rollup_assets.resources.flips import flipped_since
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.rollup_table import REPLACED_KEY, RollupTable, Written, in_windows
from rollup_assets.resources.schemas import TS
from rollup_assets.resources.visible_rows import PointerIndex, covered_mask, visible_mask

log = logging.getLogger(__name__)
# A recompute's sweep leaves superseded rows in files this much larger than what it wrote (and
# larger than SWEEP_MIN_ROWS) to the maintenance sweep; see RollupDeletions.sweep.
SWEEP_FACTOR = 8
SWEEP_MIN_ROWS = 4_096


class RollupDeletions(RollupTable):
    """How rows are dropped from a rollup table."""

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
        # Merged, bounded and indexed once: a fold sweeps thousands of buckets, and a wave's
        # correction as many, tested against every file it reads.
        bounds = WindowBounds.of(buckets)
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        index = functools.cache(lambda: PointerIndex.of(pointers))  # at the first file read
        recent = None
        if self.keeping.keeps:
            cutoff = self.keeping.cutoff(datetime.now(UTC))
            recent = flipped_since(pointers, cutoff)
            inside = pc.fill_null(in_windows(pointers["bucket_start"], bounds), False)
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
                for f in self.overlapping(files, bounds, entities)
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
                in_windows(rows["bucket_start"], bounds), pc.invert(visible_mask(rows, index()))
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
            RETAINED_FROM_KEY: iso_utc(cut),
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


def _at_most(mask: pa.ChunkedArray, rows: pa.Table, generation: int | None) -> pa.ChunkedArray:
    """`mask`, limited to rows of `generation` or older (no limit: None)."""
    if generation is None:
        return mask
    return pc.and_(mask, pc.less_equal(rows["generation"], generation))
