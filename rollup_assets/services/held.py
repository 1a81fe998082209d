"""Held writes: writes into a frozen range, waiting for the unfreeze.

A write that lands in buckets a rollup already consumed is detected as a pending job (a raw or
time-range commit for a first level, a lower level's changed cells for the levels above). The
recompute lane never writes a frozen bucket, so the part of such a job whose buckets end in the
frozen range stays pending: it is *held*. Each held write is listed with the source commit it
came from, how many of that commit's rows land in the held cells, and the cells themselves. The
unfreeze releases them: the next drain recomputes their cells through the normal recompute path
and the chain carries the change up.

A write past the watermark is no held write: it has not been consumed yet, and the forward lane
aggregates it when it closes the bucket (after the unfreeze, for a frozen bucket).
"""

from dataclasses import dataclass
from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import instants_of
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Job, LedgerSnapshot
from rollup_assets.model.placement import buckets_in, held_cells
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.resources.commit_changes import CHANGE_TYPE, ChangeFeedGone
from rollup_assets.services.engine import Engine


@dataclass(frozen=True)
class HeldWrite:
    """One source commit's write into a rollup's frozen range, held until the unfreeze."""

    rollup: str
    job: Job  # the pending job that holds it
    cells: Cells  # the held cells (buckets ending in the frozen range)
    rows: int | None  # the commit's changed source rows in those cells (None: not readable)

    @property
    def source_archive(self) -> str | None:
        return self.job.source_archive

    @property
    def source_version(self) -> int | None:
        return self.job.source_version

    @property
    def start(self) -> datetime:
        return self.cells.windows[0].start

    @property
    def end(self) -> datetime:
        return self.cells.windows[-1].end


def held_writes(
    engine: Engine,
    rollup: str,
    *,
    snapshot: LedgerSnapshot | None = None,
    state: ArchiveState | None = None,
) -> list[HeldWrite]:
    """The writes a freeze of `rollup` holds back, oldest first (none when it is not frozen)."""
    spec = engine.catalog.rollup(rollup)
    snap = snapshot or engine.ledger.snapshot()
    st = state or engine.states.get(rollup)
    out = []
    for job in snap.pending(rollup):
        cells = held_cells(spec, job, st)
        if cells:
            out.append(HeldWrite(rollup, job, cells, _rows(engine, spec, job, cells)))
    return out


def _rows(engine: Engine, spec: RollupSpec, job: Job, cells: Cells) -> int | None:
    """How many rows the job's source commit changed in `cells`."""
    if job.source_archive is None or job.source_version is None:
        return None  # a manual or chain job without a commit of its own
    source = engine.catalog.archive(job.source_archive)
    spans = list(cells.windows)
    if isinstance(source, RollupSpec) and job.parts is not None:
        # A correction up the chain names the changed cells (in the first level's buckets):
        # the rows of the level below they changed, one per cell there.
        changed = {
            (b.start, e)
            for part in job.parts_within(cells.windows) or ()
            for w, scope in part.cells
            for b in buckets_in(source, [w])
            for e in sorted(scope or ())
        }
        return len(changed)
    if isinstance(source, RollupSpec):
        try:
            rows = engine.rollups.committed_rows(
                source, job.source_version, spans, ["entity_id", "bucket_start"]
            )
        except FileNotFoundError:  # the commit or its files are vacuumed
            return None
        times = rows["bucket_start"]
    else:
        try:
            rows, _ = engine.raw.changes(
                source, job.source_version - 1, job.source_version, spans, cells.entities
            )
        except ChangeFeedGone:
            return None
        # An update is in the feed twice (before and after): count it once.
        rows = rows.filter(pc.not_equal(rows[CHANGE_TYPE], pa.scalar("update_preimage")))
        times = rows[source.time_column]
    b = Bucketing.of(spec)
    scopes = dict(cells.by_window)
    count = 0
    for entity, t in zip(rows["entity_id"].to_pylist(), instants_of(times), strict=True):
        w = b.window_of(t)
        if w in scopes:
            scope = scopes[w]
            count += scope is None or entity in scope
    return count
