"""Impact preview: what an ingest of a file would change in every level, writing nothing.

The file is validated as `ingest` validates it, and the upsert's rules are applied on the driver
to the stored rows with the file's keys (`RawStore.preview_ingest`): the rows it would insert or
replace. Those are the change rows its correction would apply (`services.correction`): at each
level, the rows in the cells they make dirty there (`model.dirty`: before the level's watermark,
as change detection and chain propagation find them) make one difference row per cell, folded
into the stored cell as a read would fold it (`compute.folding`). Rows at or after a level's
watermark are not a correction: the forward lane aggregates them when it closes their bucket
(counted, not previewed). The work is what the recompute lane would do: the cells each level
corrects and the change rows it applies; no stored cell is read by the correction itself (the
preview reads the stored cells only to show their values before and after).
"""

from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from rollup_assets.compute.arrow_partials import logical_arrow
from rollup_assets.compute.folding import ENTERING, Unknowable, difference_rows, fold_cell
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.dirty import dirty_before, dirty_cells, lifted_cells
from rollup_assets.model.partials import CELL_COLUMNS, DELTA_COLUMN
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec, SourceSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window
from rollup_assets.resources.commit_changes import CHANGE_TYPE
from rollup_assets.resources.upsert_preview import UpsertPreview
from rollup_assets.services.correction import DIFFERENCE
from rollup_assets.services.engine import Engine
from rollup_assets.services.ingest import writable_archive


@dataclass(frozen=True)
class CellChange:
    """One cell whose values the ingest would change."""

    rollup: str
    level: int  # 1: over the raw archive, 2: the level above, ...
    bucket: Window
    entity: str
    old: dict[str, object] | None  # logical values now (None: no row yet)
    new: dict[str, object] | None  # logical values after the ingest and its corrections
    held: bool  # the bucket is frozen: applied on unfreeze
    # The change cannot be folded into the stored cell exactly (every kept extreme of a
    # minimum or maximum would leave it, or it was written before companions were kept): the
    # correction aggregates it again from its source; the values it cannot tell show null.
    refill: bool = False


@dataclass(frozen=True)
class LevelWork:
    """The correction one level would run for the ingest."""

    rollup: str
    level: int
    cells: int  # the cells the ingest makes dirty (bucket, entity)
    buckets: int
    cells_changed: int  # of those, the cells whose values change
    technique: str  # difference (`services.correction`), or forward
    reason: str
    rows_to_read: int  # the change rows applied
    held_cells: int  # of the changed cells, those in a frozen range
    forward_rows: int  # rows of the batch at/after the watermark: the forward lane's


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
    changes = change_rows(spec, up)
    removed = engine.removed_spans(spec)
    work: list[LevelWork] = []
    cells: list[CellChange] = []
    for dep in engine.catalog.first_levels(spec.name):
        _level(engine, dep, spec, changes, 1, states, removed, None, work, cells)
    return Preview(
        spec.name, up.version, up.rows, up.inserted, up.updated, up.unchanged, work, cells
    )


def change_rows(spec: SourceSpec, up: UpsertPreview) -> pa.Table:
    """The upsert's rows as the change feed would show them: replaced rows as pre-images,
    their new rows as post-images, new rows as inserts."""
    keys = [ENTITY_COLUMN, spec.time_column]
    replaced = set(zip(*(up.old[k].to_pylist() for k in keys), strict=True))
    new_kinds = [
        "update_postimage" if key in replaced else "insert"
        for key in zip(*(up.new[k].to_pylist() for k in keys), strict=True)
    ]
    old = up.old.append_column(CHANGE_TYPE, pa.array(["update_preimage"] * up.old.num_rows))
    new = up.new.append_column(CHANGE_TYPE, pa.array(new_kinds, pa.string()))
    return pa.concat_tables([old.select(new.column_names).cast(new.schema), new])


def _level(
    engine: Engine,
    spec: RollupSpec,
    source: SourceSpec,
    changes: pa.Table,
    level: int,
    states: dict[str, ArchiveState],
    removed: list[Window],
    below: Cells | None,
    work: list[LevelWork],
    out: list[CellChange],
) -> None:
    """Preview `spec`'s correction by `changes` (and the levels above it): the cells they dirty
    at the first level, else the cells above the level below's (`below`), as change detection
    and chain propagation find them (`model.dirty`)."""
    consumed = dirty_before(states.get(spec.name))
    if consumed is None:
        return
    state = states[spec.name]
    times = changes[source.time_column].to_pylist()
    entities = changes[ENTITY_COLUMN].to_pylist()
    # The batch's rows the forward lane aggregates (an update's new row; its old one is not one).
    forward = sum(
        1
        for k, t in zip(changes[CHANGE_TYPE].to_pylist(), times, strict=True)
        if t >= consumed and k in ENTERING
    )
    # Exact cells (no entity limit): each is shown with its values.
    if below is None:
        rows = zip(times, entities, strict=True)
        named = dirty_cells(spec, consumed, rows=rows, removed=removed, limit=None)
    else:
        named = lifted_cells(spec, below, consumed, limit=None)
    if not named:
        if forward:
            work.append(LevelWork(spec.name, level, 0, 0, 0, "forward", "", 0, 0, forward))
        return
    b = Bucketing.of(spec)
    scopes = dict(named)
    mine = changes.filter(
        pa.array(
            [
                w in scopes and (scopes[w] is None or e in scopes[w])  # type: ignore[operator]
                for w, e in zip(b.windows_of(times), entities, strict=True)
            ],
            pa.bool_(),
        )
    )
    differences = difference_rows(mine, spec, source.time_column, CHANGE_TYPE, b)
    stored = engine.rollups.read_arrow(spec, list(named.windows), named.entities, cells=named)
    by_cell = {(r[ENTITY_COLUMN], r["bucket_start"]): r for r in stored.to_pylist()}
    held = changed = 0
    for d in differences.to_pylist():
        key = (d[ENTITY_COLUMN], d["bucket_start"])
        w = Window(d["bucket_start"], d["bucket_end"])
        old = by_cell.get(key)
        diff = [{**d, DELTA_COLUMN: True}]
        refill = False
        try:
            new = fold_cell(old, diff, spec)
        except Unknowable:
            refill = True
            try:
                new = fold_cell(old, diff, spec, unknown=True)
            except Unknowable:  # a row written before companions were kept
                new = None
        old_values, new_values = _values(old, spec), _values(new, spec)
        if old_values == new_values and not refill:
            continue
        changed += 1
        frozen = state.is_frozen(w.end)
        held += frozen
        out.append(CellChange(spec.name, level, w, key[0], old_values, new_values, frozen, refill))
    work.append(
        LevelWork(
            spec.name,
            level,
            named.named or 0,
            len(named),
            changed,
            DIFFERENCE,
            f"corrected from {mine.num_rows} change row(s) as differences",
            mine.num_rows,
            held,
            forward,
        )
    )
    # The correction writes a difference row for every one of its cells, changed or not, and
    # its flip queues the same changes for the cells above.
    for dep in engine.catalog.dependents(spec.name):
        _level(engine, dep, source, mine, level + 1, states, removed, named, work, out)


def _values(row: dict | None, spec: RollupSpec) -> dict[str, object] | None:
    if row is None:
        return None
    logical = logical_arrow(pa.Table.from_pylist([row]), spec).to_pylist()[0]
    return {k: v for k, v in logical.items() if k not in CELL_COLUMNS}
