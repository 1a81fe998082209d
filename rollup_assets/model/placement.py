"""Where a rollup's buckets stand: which a recompute may write now, and which wait.

A recompute writes only closed buckets (ending at or before the watermark) that are not frozen.
Buckets past the watermark belong to the forward lane: automatic work there waits (a write can
race an in-flight forward run), a manual request there is a no-op. Frozen buckets wait for the
unfreeze.
"""

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.cells import DEFAULT_BUCKET_ENTITY_LIMIT, Cells, Scope
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window, merge_windows


def buckets_in(spec: RollupSpec, spans: list[Window]) -> list[Window]:
    """The rollup's buckets covering `spans`, never before its first partition, in order."""
    out: set[Window] = set()
    for buckets in buckets_of_each(spec, merge_windows(spans)):
        out.update(buckets)
    return sorted(out)


def buckets_of_each(spec: RollupSpec, spans: Sequence[Window]) -> list[list[Window]]:
    """For each of `spans`, `buckets_in` it alone: the bucketing and the first partition worked
    out once for them all (a correction's cells are thousands of one-bucket spans)."""
    b = Bucketing.of(spec)
    first = first_bucket_start(spec)
    return [list(_buckets_of_span(b, first, span)) for span in spans]


# A correction's thousands of spans are cut into buckets again at each step of its run (its
# buckets, its cells, the cells above) and by the sensors: the buckets of a span follow from the
# bucketing alone, and are kept.
@functools.lru_cache(maxsize=1 << 15)
def _buckets_of_span(b: Bucketing, first: datetime, span: Window) -> tuple[Window, ...]:
    return tuple(w for w in b.windows(max(span.start, first), span.end) if w.start >= first)


def cells_of(spec: RollupSpec, job: Job) -> Cells:
    """The job's cells, bucket by bucket: the entities `job.cells` names for a bucket (its
    spans expanded to buckets), else the job's `entities`."""
    buckets = buckets_in(spec, list(job.windows))
    if job.cells is None:
        return Cells.of(buckets, job.entities)
    named: dict[Window, Scope] = {}
    spans = [span for span, _ in job.cells]
    for (_, scope), each in zip(job.cells, buckets_of_each(spec, spans), strict=True):
        for w in each:
            named[w] = scope
    return Cells(tuple((w, named.get(w, job.entities)) for w in buckets))


def job_scope(
    cells: Cells, entity_limit: int | None = DEFAULT_BUCKET_ENTITY_LIMIT
) -> tuple[tuple[Window, ...], Scope, Cells | None]:
    """A job's `windows`, `entities` and `cells` for covering exactly `cells`: the buckets, every
    entity they name (None past `entity_limit` or when a bucket covers every entity), and the
    cells themselves unless they are just that cross product."""
    entities = cells.entities
    if entities is not None and entity_limit is not None and len(entities) > entity_limit:
        entities = None
    product = cells.is_product() and all(scope == entities for _, scope in cells)
    return cells.windows, entities, None if product else cells


@dataclass(frozen=True)
class Placement:
    """A job's buckets split by what may happen to them now (each list in order)."""

    ready: list[Window]  # closed and not frozen: recompute now
    frozen: list[Window]  # ending in the frozen range
    later: list[Window]  # at or past the watermark (open or not yet aggregated)

    def waiting(self, trigger: Trigger) -> list[Window]:
        """The buckets that stay pending: frozen ones, and automatic work past the watermark."""
        return self.frozen + (self.later if trigger is not Trigger.MANUAL else [])


def place(buckets: list[Window], state: ArchiveState) -> Placement:
    mark = state.watermark
    frozen = [w for w in buckets if state.is_frozen(w.end)]
    ready = [
        w for w in buckets if not state.is_frozen(w.end) and mark is not None and w.end <= mark
    ]
    placed = {*frozen, *ready}  # a set: a year of hourly buckets is 8,760 of them
    return Placement(ready, frozen, [w for w in buckets if w not in placed])


def held_cells(spec: RollupSpec, job: Job, state: ArchiveState) -> Cells:
    """The cells of `job` whose buckets end in the rollup's frozen range: the part of a pending
    job that a freeze holds back until the unfreeze (none when the rollup is not frozen)."""
    if state.frozen_until is None or job.state is not JobState.PENDING:
        return Cells()
    frozen = place(buckets_in(spec, list(job.windows)), state).frozen
    return cells_of(spec, job).restrict(frozen) if frozen else Cells()
