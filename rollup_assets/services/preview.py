"""Impact preview: what an ingest of a file would change in every level, writing nothing.

The file is validated as `ingest` validates it, and the upsert's rules are applied on the driver
to the stored rows with the file's keys (`RawStore.preview_ingest`): the rows it would insert or
replace. Each first-level rollup that already aggregated a changed row's bucket would recompute
that cell (as change detection makes it dirty); its new partials are aggregated from the cell's
source rows as they would stand after the ingest, and compared with the stored ones as a
recompute compares them. The cells that change make the containing cells one level up dirty
(as chain propagation does), whose new partials merge the level below's partials with the
changed ones in place, and so on up. Rows at or after a level's watermark are not a
correction: the forward lane aggregates them when it closes their bucket (counted, not
previewed). The work is what the recompute lane would do: the cells each level corrects, the
technique the cost model picks (`services.incremental`) and the rows it reads.
"""

import bisect
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from resources.raw_store import SourceSpec, UpsertPreview
from rollup_assets.compute.aggregation import SOURCE_ROWS
from rollup_assets.compute.arrow_partials import logical_arrow, partials_arrow
from rollup_assets.compute.compare import CHANGED, cell_changes_arrow
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import DEFAULT_BUCKET_ENTITY_LIMIT, Cells
from rollup_assets.model.deltas import (
    Change,
    ChangeType,
    Replacement,
    StoredCell,
    apply_to_cells,
    merge_into_cells,
)
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.specs import ENTITY_COLUMN, ArchiveSpec, RollupSpec, key_columns
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.services.engine import CHANGE_CELLS, KEYS, Engine, cell_keys
from rollup_assets.services.incremental import (
    DELTA,
    RECOMPUTE,
    below_reason,
    delta_source,
    merged_inputs,
    replacements_above,
)
from rollup_assets.services.ingest import writable_archive


@dataclass(frozen=True)
class CellChange:
    """One cell whose values the ingest would change."""

    rollup: str
    level: int  # 1: over the raw archive, 2: the level above, ...
    bucket: Window
    entity: str
    old: dict[str, object] | None  # logical values now (None: no row yet)
    new: dict[str, object]  # logical values after the ingest and its recomputes
    held: bool  # the bucket is frozen: applied on unfreeze


@dataclass(frozen=True)
class LevelWork:
    """The recompute one level would run for the ingest."""

    rollup: str
    level: int
    cells: int  # the cells the ingest makes dirty (bucket, entity)
    buckets: int
    cells_changed: int  # of those, the cells whose values change
    technique: str  # delta | delta+recompute | recompute (`services.incremental`), or forward
    reason: str  # the cost model's
    rows_to_read: int  # change rows read (delta) plus source rows aggregated (recompute)
    held_cells: int  # of the changed cells, those in a frozen range
    forward_rows: int  # rows of the file at/after the watermark: the forward lane's


@dataclass(frozen=True)
class Preview:
    archive: str
    version: int | None  # the raw table version the preview read
    rows: int
    inserted: int
    updated: int
    unchanged: int
    work: list[LevelWork]
    cells: list[CellChange]


def preview_ingest(engine: Engine, archive: str, path: str | Path) -> Preview:
    """What `ingest_file(engine, archive, path, ...)` would change, writing nothing. Raises
    what the ingest raises for the same file (IngestValidationError, ArchiveNotActivatedError,
    ...)."""
    spec, state = writable_archive(engine, archive)
    up = engine.raw.preview_ingest(spec, path, not_before=state.retained_from)
    states = engine.states.all()
    work: list[LevelWork] = []
    cells: list[CellChange] = []
    changed_rows = pa.concat_tables([up.old.select(up.new.column_names), up.new])
    times = changed_rows[spec.time_column].to_pylist()
    entities = changed_rows[ENTITY_COLUMN].to_pylist()
    for dep in engine.catalog.first_levels(spec.name):
        dstate = states.get(dep.name) or ArchiveState(dep.name)
        consumed = _consumed(dstate)
        if consumed is None:
            continue
        b = Bucketing.of(dep)
        pairs = [(b.window_of(t), e) for t, e in zip(times, entities, strict=True) if t < consumed]
        forward = sum(1 for t in times if t >= consumed) - _forward_old(up, spec, consumed)
        named = Cells.from_pairs(pairs, limit=len(pairs) + 1)
        named = named.restrict(buckets_in(dep, list(named.windows)))
        if not named:
            if forward:
                work.append(LevelWork(dep.name, 1, 0, 0, 0, "forward", "", 0, 0, forward))
            continue
        fresh_rows = _RawAfter(engine, spec, up)
        _level(engine, dep, spec, named, fresh_rows, 1, dstate, states, work, cells, forward)
    return Preview(
        spec.name, up.version, up.rows, up.inserted, up.updated, up.unchanged, work, cells
    )


def _consumed(state: ArchiveState) -> datetime | None:
    if state.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED):
        return None
    return state.consumed_until


def _forward_old(up: UpsertPreview, spec: SourceSpec, consumed: datetime) -> int:
    """Replaced rows at/after `consumed` (counted once, with their new image)."""
    return sum(1 for t in up.old[spec.time_column].to_pylist() if t >= consumed)


class _RawAfter:
    """A first level's source rows of some cells as they would stand after the ingest."""

    def __init__(self, engine: Engine, spec: SourceSpec, up: UpsertPreview) -> None:
        self.engine, self.spec, self.up = engine, spec, up

    def rows(self, cells: Cells) -> pa.Table:
        spans = merge_windows(list(cells.windows))
        stored, _ = self.engine.raw.read_rows(self.spec, spans, cells.entities, cells=cells)
        new = self.up.new.select(stored.column_names).cast(stored.schema)
        keys = key_columns(self.spec)
        kept = stored.join(new.select(keys), keys, join_type="left anti")
        return _in_cells(pa.concat_tables([kept, new]), self.spec.time_column, cells)


class _RollupAfter:
    """A level's stored partials of some cells with the changed partials in their place (the
    `changed` cells' partials before are `replaced`)."""

    def __init__(
        self, engine: Engine, spec: RollupSpec, changed: pa.Table, replaced: pa.Table
    ) -> None:
        self.engine, self.spec, self.changed, self.replaced = engine, spec, changed, replaced

    def replacements(self) -> dict[tuple[str, datetime], Replacement]:
        """Each changed cell's partials before and after (None: no row)."""
        names = [sc.name for sc in self.spec.stored_columns]

        def by_cell(rows: pa.Table) -> dict[tuple[str, datetime], dict]:
            return {
                (r[ENTITY_COLUMN], r["bucket_start"]): {n: r[n] for n in names}
                for r in rows.select([*KEYS, *names]).to_pylist()
            }

        old, new = by_cell(self.replaced), by_cell(self.changed)
        return {k: (old.get(k), new.get(k)) for k in {*old, *new}}

    def rows(self, cells: Cells) -> pa.Table:
        spans = merge_windows(list(cells.windows))
        names = [*KEYS, "bucket_end", *(sc.name for sc in self.spec.stored_columns)]
        stored = self.engine.rollups.read_arrow(
            self.spec, spans, cells.entities, columns=names, cells=cells
        ).select(names)
        new = self.changed.select(names).cast(stored.schema)
        kept = stored.join(new.select(KEYS), KEYS, join_type="left anti")
        return _in_cells(pa.concat_tables([kept.select(names), new]), "bucket_start", cells)


def _in_cells(rows: pa.Table, time_column: str, cells: Cells) -> pa.Table:
    """The rows whose time and entity fall in one of `cells`."""
    if rows.num_rows == 0:
        return rows
    keep = []
    ordered = list(cells.by_window)  # in bucket order
    starts = [w.start for w, _ in ordered]
    for t, e in zip(rows[time_column].to_pylist(), rows[ENTITY_COLUMN].to_pylist(), strict=True):
        i = bisect.bisect_right(starts, t) - 1
        w, scope = ordered[i] if i >= 0 else (None, None)
        keep.append(w is not None and t < w.end and (scope is None or e in scope))
    return rows.filter(pa.array(keep, pa.bool_()))


def _level(
    engine: Engine,
    spec: RollupSpec,
    source: ArchiveSpec,
    named: Cells,
    after: "_RawAfter | _RollupAfter",
    level: int,
    state: ArchiveState,
    states: dict[str, ArchiveState],
    work: list[LevelWork],
    out: list[CellChange],
    forward: int = 0,
) -> None:
    """Preview `spec`'s recompute of `named` cells (and of the cells it makes dirty above)."""
    scoped = Cells.collect(named, DEFAULT_BUCKET_ENTITY_LIMIT)
    unfit, _ = delta_source(engine, spec, scoped)
    rows = after.rows(scoped)
    fresh = partials_arrow(rows, list(named.windows), cell_keys(named), spec, source)
    technique, reason, read = RECOMPUTE, unfit or "", rows.num_rows
    if unfit is None and isinstance(after, _RawAfter):
        technique, reason, read = _delta_work(spec, source, named, after, rows)
    # Up the chain, in the run that changed the level below: named cells, buckets queued for
    # every entity narrowed to the entities that changed (`services.incremental`).
    below = named.named is not None and named.named <= CHANGE_CELLS
    if below and isinstance(after, _RollupAfter) and isinstance(source, RollupSpec):
        technique, reason, read = _below_work(engine, spec, source, named, after, rows)
    spans = merge_windows(list(named.windows))
    stored = engine.rollups.read_arrow(spec, spans, named.entities, cells=named)
    stored = stored.join(cell_keys(named), KEYS, join_type="inner")
    diff = cell_changes_arrow(fresh, stored, spec).filter(pc.field(CHANGED))
    changed_keys = diff.select(KEYS)
    new_rows = fresh.join(changed_keys, KEYS, join_type="inner").drop_columns([SOURCE_ROWS])
    old_rows = stored.join(changed_keys, KEYS, join_type="inner")
    old_by_key = {(r["entity_id"], r["bucket_start"]): r for r in _logical(old_rows, spec)}
    held = 0
    for r in _logical(new_rows, spec):
        w = Window(r["bucket_start"], r["bucket_end"])
        frozen = state.is_frozen(w.end)
        held += frozen
        old = old_by_key.get((r["entity_id"], r["bucket_start"]))
        out.append(
            CellChange(spec.name, level, w, r["entity_id"], _values(old), _values(r) or {}, frozen)
        )
    work.append(
        LevelWork(
            spec.name,
            level,
            len(named_cells(named)),
            len(scoped),
            new_rows.num_rows,
            technique,
            reason,
            read,
            held,
            forward,
        )
    )
    if new_rows.num_rows == 0:
        return
    changed = Cells.collect(
        ((Window(s, e), frozenset([n])) for n, s, e in _triples(new_rows)), limit=None
    )
    for dep in engine.catalog.dependents(spec.name):
        dstate = states.get(dep.name) or ArchiveState(dep.name)
        consumed = _consumed(dstate)
        if consumed is None:
            continue
        lifted = Cells.collect(
            (
                (up, scope)
                for w, scope in changed
                if w.start < consumed
                for up in buckets_in(dep, [w])
                if up.start < consumed
            ),
            limit=None,
        )
        if lifted:
            after_up = _RollupAfter(engine, spec, new_rows, old_rows)
            _level(engine, dep, spec, lifted, after_up, level + 1, dstate, states, work, out)


def _delta_work(
    spec: RollupSpec, source: ArchiveSpec, named: Cells, after: _RawAfter, rows: pa.Table
) -> tuple[str, str, int]:
    """The technique, reason and rows read of correcting `named` cells from the ingest's
    changes, as `services.incremental.correct` decides it: the stored partials corrected by
    the change rows (an update is a before and an after image), cells a change cannot correct
    exactly (no stored partial, a retracted extreme, ...) recomputed from their rows."""
    up, b = after.up, Bucketing.of(spec)
    columns = sorted({sc.column for sc in spec.stored_columns})
    names = [sc.name for sc in spec.stored_columns]
    keys = [(e, w.start) for w, e in named_cells(named)]
    stored = after.engine.rollups.read_arrow(spec, list(named.windows), named.entities, cells=named)
    cells = {
        (r[ENTITY_COLUMN], r["bucket_start"]): StoredCell(0, {n: r[n] for n in names})
        for r in stored.to_pylist()
    }
    old_ids, old_times = up.old[ENTITY_COLUMN].to_pylist(), up.old[source.time_column].to_pylist()
    replaced = set(zip(old_ids, old_times, strict=True))
    changes: list[tuple[tuple[str, datetime], int, Change]] = []
    for table, kind in ((up.old, ChangeType.UPDATE_PREIMAGE), (up.new, None)):
        for r in table.select([ENTITY_COLUMN, source.time_column, *columns]).to_pylist():
            t, e = r[source.time_column], r[ENTITY_COLUMN]
            how = kind or (ChangeType.UPDATE_POSTIMAGE if (e, t) in replaced else ChangeType.INSERT)
            changes.append(((e, b.window_of(t).start), 1, Change(how, {c: r[c] for c in columns})))
    applied = apply_to_cells(keys, cells, changes, spec.stored_columns)
    reason = (
        f"{len(keys)} named cell(s): corrected from {applied.change_rows} change row(s) of "
        f"{source.name}"
    )
    if not applied.recompute:
        return DELTA, reason, applied.change_rows
    again = set(applied.recompute)  # (entity, bucket start)
    times, ids = rows[source.time_column].to_pylist(), rows[ENTITY_COLUMN].to_pylist()
    redo = sum(1 for t, e in zip(times, ids, strict=True) if (e, b.window_of(t).start) in again)
    reason += f"; recomputed from source rows: {applied.reasons()}"
    return f"{DELTA}+{RECOMPUTE}", reason, applied.change_rows + redo


def _below_work(
    engine: Engine,
    spec: RollupSpec,
    source: RollupSpec,
    named: Cells,
    after: _RollupAfter,
    rows: pa.Table,
) -> tuple[str, str, int]:
    """The technique, reason and rows read of correcting `named` cells of a rollup over a
    rollup from the old and new partials of the cells below that change, as
    `services.incremental` does in the run that changed them: cells the change cannot correct
    (no stored partial, a retracted extreme, a cell below emptied) merged again."""
    names = [sc.name for sc in spec.stored_columns]
    keys = [(e, w.start) for w, e in named_cells(named)]
    stored = engine.rollups.read_arrow(spec, list(named.windows), named.entities, cells=named)
    cells = {
        (r[ENTITY_COLUMN], r["bucket_start"]): {n: r[n] for n in names} for r in stored.to_pylist()
    }
    moves = replacements_above(after.replacements(), list(named.windows))
    applied = merge_into_cells(keys, cells, moves, spec.stored_columns, merged_inputs(spec, source))
    reason = below_reason(len(keys), applied.change_rows, source)
    if not applied.recompute:
        return DELTA, reason, applied.change_rows
    b = Bucketing.of(spec)
    again = set(applied.recompute)
    times, ids = rows["bucket_start"].to_pylist(), rows[ENTITY_COLUMN].to_pylist()
    redo = sum(1 for t, e in zip(times, ids, strict=True) if (e, b.window_of(t).start) in again)
    reason += f"; merged again from {source.name}: {applied.reasons()}"
    return f"{DELTA}+{RECOMPUTE}", reason, applied.change_rows + redo


def named_cells(cells: Cells) -> list[tuple[Window, str]]:
    return [(w, e) for w, scope in cells for e in sorted(scope or ())]


def _triples(rows: pa.Table) -> list[tuple[str, datetime, datetime]]:
    return list(
        zip(
            rows[ENTITY_COLUMN].to_pylist(),
            rows["bucket_start"].to_pylist(),
            rows["bucket_end"].to_pylist(),
            strict=True,
        )
    )


def _logical(rows: pa.Table, spec: RollupSpec) -> list[dict]:
    return logical_arrow(rows, spec).to_pylist()


def _values(row: dict | None) -> dict[str, object] | None:
    if row is None:
        return None
    return {k: v for k, v in row.items() if k not in ("entity_id", "bucket_start", "bucket_end")}
