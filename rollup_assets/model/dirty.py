"""Dirty cells: which cells of a rollup a change of its source makes dirty, and which cells of
the next level up they make dirty in turn.

A changed source row (or a changed span of a time-range archive, or of a commit known only by
its files' statistics) dirties the cell of its bucket and entity at every first-level rollup
that already consumed it: its time lies before what the rollup aggregated (a write at or after
that is the forward lane's). Never before the rollup's first bucket, and never in a range whose
source rows retention removed: the stored rows are the only record there, nothing can correct
them. A dirty cell of one level dirties the cell of the bucket containing it one level up, for
the same entity, when that level already consumed the bucket.

Change detection (`sensors.detection`) and chain propagation (`model.propagation`) queue the
work of these cells; the impact preview (`services.preview`) shows what it would change.
"""

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import DEFAULT_BUCKET_ENTITY_LIMIT, Cells
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window

_INSTANT = timedelta(microseconds=1)


def dirty_before(state: ArchiveState | None) -> datetime | None:
    """The instant before which a change of a rollup's source dirties its cells (its consumed
    watermark, a forward claim included); None when it has none: a rollup not activated yet,
    deleted, or that has aggregated nothing."""
    if state is None or state.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED):
        return None
    return state.consumed_until


def dirty_cells(
    spec: RollupSpec,
    consumed: datetime,
    *,
    rows: Iterable[tuple[datetime, str | None]] = (),
    spans: Iterable[tuple[datetime, datetime, str | None]] = (),
    removed: Sequence[Window] = (),
    limit: int | None = DEFAULT_BUCKET_ENTITY_LIMIT,
) -> Cells:
    """The cells of first-level rollup `spec` that a change of its source dirties, given what
    `spec` consumed (`dirty_before`): the bucket of each changed row's time (`rows`: time and
    entity), and each bucket a changed span overlaps (`spans`: first and last instant, both
    inclusive, and entity), before `consumed`; an entity of None stands for every entity. None
    before the rollup's first bucket, none overlapping a span of `removed` (source rows
    retention removed). Per bucket, the entities named: every entity past `limit` (None: no
    limit, the exact cells)."""
    b = Bucketing.of(spec)
    pairs: list[tuple[Window, str | None]] = []
    retro = [(t, entity) for t, entity in rows if t < consumed]
    if retro:
        windows = b.windows_of([t for t, _ in retro])
        pairs += [(w, entity) for w, (_, entity) in zip(windows, retro, strict=True)]
    for first, last, entity in spans:
        if first >= consumed:
            continue
        last = min(last, consumed - _INSTANT)
        pairs += [(w, entity) for w in b.windows(first, last + _INSTANT)]
    cells = Cells.from_pairs(pairs, limit)
    return cells.restrict(
        w
        for w in buckets_in(spec, list(cells.windows))
        if w.start < consumed and not any(w.overlaps(r) for r in removed)
    )


def lifted_cells(
    dep: RollupSpec,
    cells: Cells,
    consumed: datetime,
    limit: int | None = DEFAULT_BUCKET_ENTITY_LIMIT,
) -> Cells:
    """The cells of `dep` (a rollup of the level whose cells are `cells`) that those dirty,
    given what `dep` consumed (`dirty_before`): the buckets containing them that start before
    `consumed`, for the same entities. A bucket above gathers the entities of many buckets
    below: past `limit` (None: no limit, the exact cells) it is dirty for every entity."""
    return Cells.collect(
        (
            (up, scope)
            for window, scope in cells
            if window.start < consumed
            for up in buckets_in(dep, [window])
            if up.start < consumed
        ),
        limit,
    )
