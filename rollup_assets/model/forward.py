"""The forward lane's rules: which buckets may close now, and which bucket is open.

Buckets close in order once `bucket_end <= now - watermark_lag` (and, for a rollup of a rollup,
once the source level has closed them too); frozen buckets never close. The open buckets are the
ones the clock has not closed yet: the bucket containing `now`, and a bucket that has ended but
is still inside the watermark lag (late readings may still arrive for it). They are refreshed
without moving the watermark, so a reading of the last minutes is visible before its bucket
closes. A new rollup starts one bucket back: no implicit history scan (history is a backfill).
"""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import takewhile

from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.jobs import Trigger, refreshed_first
from rollup_assets.model.specs import Catalog, RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window, as_utc

MAX_BUCKETS_PER_RUN = 20_000


def initial_watermark(spec: RollupSpec, now: datetime) -> datetime:
    b = Bucketing.of(spec)
    return max(first_bucket_start(spec), b.prev_start(b.floor(now)))


def source_limit(
    catalog: Catalog, spec: RollupSpec, states: dict[str, ArchiveState]
) -> datetime | None:
    """How far the source lets this rollup close buckets: a rollup source's watermark."""
    if spec.source in catalog.rollups:
        src = states.get(spec.source)
        return (
            src.watermark
            if src is not None and src.watermark is not None
            else datetime.min.replace(tzinfo=UTC)
        )
    return None


def closed_buckets(
    spec: RollupSpec, state: ArchiveState, now: datetime, limit: datetime | None
) -> list[Window]:
    """Buckets after the watermark that may close now, in order (stopping at a frozen one)."""
    if state.watermark is None:
        return []
    horizon = as_utc(now) - spec.watermark_lag
    if limit is not None:
        horizon = min(horizon, limit)
    b = Bucketing.of(spec)
    out: list[Window] = []
    start = state.watermark
    while len(out) < MAX_BUCKETS_PER_RUN:
        end = b.next_start(start)
        if end > horizon or state.is_frozen(end):
            break
        out.append(Window(start, end))
        start = end
    return out


def open_buckets(spec: RollupSpec, state: ArchiveState, now: datetime) -> list[Window]:
    """The buckets at or after the watermark that the clock has not closed yet, in order: the
    one containing `now`, and any that ended less than `watermark_lag` ago. Frozen ones and
    those before the rollup's first partition are left out."""
    if not spec.refresh_open_bucket:
        return []
    b = Bucketing.of(spec)
    horizon = as_utc(now) - spec.watermark_lag
    first = first_bucket_start(spec)
    floor = first if state.watermark is None else max(first, state.watermark)
    out: list[Window] = []
    w = b.window_of(now)
    while w.end > horizon and w.start >= floor:
        if not state.is_frozen(w.end):
            out.append(w)
        w = Window(b.prev_start(w.start), w.start)
    return out[::-1]


@dataclass(frozen=True)
class ForwardWork:
    """What a forward run of a rollup does: the buckets it closes (in order) and the open
    buckets it refreshes (in order)."""

    closed: list[Window]
    refresh: list[Window]

    @property
    def buckets(self) -> list[Window]:
        return [*self.closed, *self.refresh]

    @property
    def trigger(self) -> Trigger:
        """A run that closes a bucket moves the watermark; one that only refreshes does not."""
        return Trigger.FORWARD if self.closed else Trigger.OPEN_BUCKET

    def __bool__(self) -> bool:
        return bool(self.closed or self.refresh)

    def without(self, refreshing: list[Window]) -> "ForwardWork":
        """This work less the buckets that read what a refresh of the source aggregates again
        (`refreshing`): they wait for it. Buckets close in order, so none closes after the
        first that waits; an open bucket that reads none of it is refreshed all the same."""
        closed = list(takewhile(lambda b: not refreshed_first([b], refreshing), self.closed))
        refresh = [b for b in self.refresh if not refreshed_first([b], refreshing)]
        return ForwardWork(closed, refresh)


def forward_work(
    catalog: Catalog,
    spec: RollupSpec,
    state: ArchiveState,
    now: datetime,
    states: dict[str, ArchiveState],
    changed_in: Callable[[Window], bool],
) -> ForwardWork:
    """What the forward lane of `spec` has to do now: the buckets that may close, and the open
    buckets its source changed in (`changed_in`: asked only of an open bucket when nothing
    closes), or all of them when buckets close (a closing run refreshes them anyway)."""
    closed = closed_buckets(spec, state, now, source_limit(catalog, spec, states))
    refresh = [
        ob
        for ob in open_buckets(spec, state, now)
        if ob not in closed and (closed or changed_in(ob))
    ]
    return ForwardWork(closed, refresh)
