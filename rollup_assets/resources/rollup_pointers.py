"""A rollup's pointer table (`genmap`) as its writers see it: what it says now (the fence, the
jobs it names) and every commit to it. Flips and rollbacks are compare-and-sets on the rollup's
fence; a fence move, a rewind and retention move it, the latter two dropping the pointers of
rows they delete next (`rollup_deletions`).
"""

from collections.abc import Callable
from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.model.cells import Cells
from rollup_assets.model.operations import OPERATION_KEY, RETAINED_FROM_KEY, Operation
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import iso_utc, micros
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.flips import flipped_pointers
from rollup_assets.resources.genmap import (
    read_fence,
    read_pointers,
    retained_mark,
    write_pointer_table,
)
from rollup_assets.resources.rollup_table import RollupTable
from rollup_assets.resources.schemas import TS


class RollupPointers(RollupTable):
    """What a rollup's pointer table says now (its fence, the jobs it names), and every change
    to it."""

    def fence(self, spec: RollupSpec) -> int | None:
        """The rollup's fence now (`genmap`): read it before reading anything a
        pointer commit relies on, and hand it to that commit."""
        return read_fence(self.genmap_uri(spec), self.options)

    def move_fence(self, spec: RollupSpec, why: str, *, job_id: str = "") -> int:
        """Move the rollup's fence without changing a pointer: every action that read it before
        fails its pointer commit (a disable, a delete, recovering an interrupted rollback)."""
        return write_pointer_table(
            self.genmap_uri(spec),
            lambda current: current,
            metadata={
                OPERATION_KEY: Operation.FENCE,
                "rollups.reason": why,
                "rollups.job_id": job_id,
            },
            storage_options=self.options,
            move=True,
        )

    def flipped_jobs(self, spec: RollupSpec) -> frozenset[str]:
        """Ids of the jobs whose pointers are in the pointer table now."""
        pointers, _ = read_pointers(self.genmap_uri(spec), self.options)
        return frozenset(j for j in pointers["job_id"].to_pylist() if j is not None)

    def flip(
        self,
        spec: RollupSpec,
        cells: Cells,
        generation: int,
        *,
        job_id: str,
        run_id: str,
        fence: int | None,
        delta: bool = False,
    ) -> int:
        """The atomic commit point: `generation`'s base rows (or, with `delta`, its difference
        rows) become visible on `cells`, if the rollup's fence is still `fence` (read before
        the job read anything; else FenceMovedError)."""
        return write_pointer_table(
            self.genmap_uri(spec),
            lambda cur: flipped_pointers(cur, cells, generation, job_id, run_id, delta=delta),
            metadata={
                OPERATION_KEY: Operation.FLIP,
                "rollups.generation": str(generation),
                "rollups.job_id": job_id,
            },
            storage_options=self.options,
            expect=fence,
        )

    def restore_pointers(
        self,
        spec: RollupSpec,
        change: Callable[[pa.Table], pa.Table],
        *,
        job_id: str,
        undoes: str,
        fence: int | None,
    ) -> int:
        """A rollback's atomic commit point: the pointer table becomes `change(current)`, if its
        fence is still `fence`; the commit moves the fence (a recompute in flight computed from
        what the rollback changed: it must not flip)."""
        return write_pointer_table(
            self.genmap_uri(spec),
            change,
            metadata={
                OPERATION_KEY: Operation.ROLLBACK,
                "rollups.job_id": job_id,
                "rollups.undoes": undoes,
            },
            storage_options=self.options,
            expect=fence,
            move=True,
        )

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

    def pointers_retained_from(self, spec: RollupSpec) -> datetime | None:
        """The instant before which retention dropped every pointer of the rollup, as its
        pointer table records it (None: it never did)."""
        mark = retained_mark(open_table(self.genmap_uri(spec), self.options))
        return datetime.fromtimestamp(mark / 1e6, UTC) if mark else None

    def drop_pointers_before(self, spec: RollupSpec, cut: datetime) -> int | None:
        """Retention's first effect: drop the pointers of buckets starting before `cut` in one
        commit that records `cut` (`RETAINED_FROM_KEY`) and moves the rollup's fence, so a recompute
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
                RETAINED_FROM_KEY: iso_utc(cut),
            },
            storage_options=self.options,
            move=True,
            marks=[(RETAINED_FROM_KEY, micros(cut))],
        )
