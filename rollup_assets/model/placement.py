"""Where a rollup's buckets stand: which a recompute may write now, and which wait.

A recompute writes only closed buckets (ending at or before the watermark) that are not frozen.
Buckets past the watermark belong to the forward lane: automatic work there waits (a write can
race an in-flight forward run), a manual request there is a no-op. Frozen buckets wait for the
unfreeze.
"""

from dataclasses import dataclass

from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.jobs import Trigger
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window, merge_windows


def buckets_in(spec: RollupSpec, spans: list[Window]) -> list[Window]:
    """The rollup's buckets covering `spans`, never before its first partition, in order."""
    b = Bucketing.of(spec)
    first = first_bucket_start(spec)
    out: set[Window] = set()
    for span in merge_windows(spans):
        out.update(w for w in b.windows(max(span.start, first), span.end) if w.start >= first)
    return sorted(out)


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
