"""Correcting a rollup's cells: from their source's changes where that is exact and cheaper,
from their source rows otherwise.

The cost model, per job:

- **delta**: a first-level rollup over a raw (or time-range) archive with its change data feed
  on, and a job of named cells (at most `DRIVER_CELLS`). Each cell's stored partials reflect a
  source version (the lineage every row stores); the changes committed after it are read from
  the change feed (only the commits, days and entities of the job's cells) and applied on the
  driver, without reading the cells' source rows and without a Spark job
  (`model.deltas.apply_to_cells`). Cells a change cannot correct exactly (a retracted extreme,
  a delete, no stored partial, ...) are recomputed from their source rows, at the same source
  version, in the same generation.
- **delta, up the chain**: a rollup over a rollup, a job of named cells (at most
  `CHANGE_CELLS`) run in the run that just changed the level below, which hands over what it
  flipped (`LevelChange`): each stored cell takes the old partials of its changed cells below
  out and the new ones in (`model.deltas.merge_into_cells`), without reading the level below,
  where its lineage shows that is exact (`_from_below`). The other cells are merged again from
  the level below, at the same state of it, in the same generation.
- **recompute**: everything else (a rollup over a rollup without a change handed over,
  buckets for every entity, jobs too large for the driver, a source without change feed, more
  than `MAX_APPLY_COMMITS` commits to read back, a change feed no longer reaching back): the
  cells are aggregated again from their source rows.

The job records which technique ran and why (`Recomputed.technique`, `Recomputed.reason`).
"""

import bisect
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import SparkSession

from resources.genmap import active_mask
from resources.raw_store import CHANGE_TYPE, COMMIT_VERSION, ChangeFeedGone
from resources.rollup_store import Reflected, Snapshot
from resources.schemas import data_schema
from rollup_assets.model.cells import Cells
from rollup_assets.model.deltas import (
    Applied,
    Change,
    ChangeType,
    Replacement,
    StoredCell,
    apply_to_cells,
    merge_into_cells,
)
from rollup_assets.model.specs import ENTITY_COLUMN, RollupSpec
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.services.engine import (
    CHANGE_CELLS,
    DRIVER_CELLS,
    KEYS,
    CellKey,
    CellOutcome,
    Engine,
    LevelChange,
    Recomputed,
    Stored,
)
from rollup_assets.services.surface import Changed, changed_cells

# Reading further back than this many source commits costs more than reading the cells' rows.
MAX_APPLY_COMMITS = 1_000
# Up the chain, each state of the level below that stored cells record is compared with the
# state a change was read at by reading the commits in between: at most this many states, and
# this many row-table commits from each; cells recording others are merged again.
MAX_BELOW_STATES = 16
MAX_BELOW_COMMITS = 256
DELTA = "delta"
RECOMPUTE = "recompute"


def correct(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    cells: Cells,
    *,
    fold: bool = False,
    below: LevelChange | None = None,
) -> Recomputed:
    """The corrected partials of `cells`, compared with the stored ones (see the module). A
    `fold` (maintenance rewriting buckets whole to fold their cell pointers) changes the layout
    only: it is always a recompute, and writes only the buckets whose cells are all unchanged.
    `below` is what a job of the level below just flipped, when this run knows it."""
    if fold:
        result = engine.recompute(spark, spec, cells, settled_only=True)
        result.technique, result.reason = RECOMPUTE, "fold: buckets rewritten whole if settled"
        return result
    # Cells whose raw rows retention removed are never corrected, not even from the change feed:
    # their stored rows are the only record (a change there raced the retention).
    engine.require_source_rows(spec, list(cells.windows))
    source = engine.catalog.archive(spec.source)
    if isinstance(source, RollupSpec) and below is not None and below.rollup == source.name:
        return _from_below(engine, spark, spec, source, cells, below)
    unfit, table = delta_source(engine, spec, cells)
    if unfit is not None or table is None:
        result = engine.recompute(spark, spec, cells)
        why = unfit or "no source table"
        result.technique = RECOMPUTE
        result.reason = result.reason or why  # a first fill says what it does instead
        return result
    version = table.version()
    spans = merge_windows(list(cells.windows))
    own = engine.rollups.snapshot(spec)
    stored_rows = engine.rollups.read_arrow(
        spec, spans, cells.entities, own, cells=cells, exact=True
    )
    stored = _stored_cells(stored_rows, spec, source.name, version)
    by_start = {w.start: w for w in cells.windows}
    keys: list[CellKey] = [(e, w.start) for w, scope in cells for e in sorted(scope or ())]
    oldest = min((c.version for c in stored.values()), default=version)
    if version - oldest > MAX_APPLY_COMMITS:
        result = engine.recompute(spark, spec, cells, raw_table=table)
        result.technique = RECOMPUTE
        result.reason = (
            f"{version - oldest} source commits since the oldest stored partial "
            f"(more than {MAX_APPLY_COMMITS}): reading the cells' rows is cheaper"
        )
        return result
    try:
        changes, read = engine.raw.changes(
            source,  # type: ignore[arg-type]
            oldest,
            version,
            spans,
            cells.entities,
        )
    except ChangeFeedGone as gone:
        result = engine.recompute(spark, spec, cells, raw_table=table)
        result.technique, result.reason = RECOMPUTE, f"change feed unavailable: {gone}"
        return result
    applied = apply_to_cells(
        keys,
        stored,
        _changes(changes, source.time_column, cells.windows, spec),
        spec.stored_columns,
    )
    reason = (
        f"{len(keys)} named cell(s): corrected from {applied.change_rows} change row(s) "
        f"({read} read) of {source.name} up to version {version}"
    )
    return _outcome(
        spec,
        applied,
        by_start,
        {source.name: version},
        reason,
        (held := Stored(stored_rows, own.reflects)),
        lambda leftover: engine.recompute(spark, spec, leftover, raw_table=table, stored=held),
        "recomputed from source rows",
    )


def _outcome(
    spec: RollupSpec,
    applied: Applied[CellKey],
    by_start: dict[datetime, Window],
    versions: dict[str, int],
    reason: str,
    before: Stored,
    recompute: Callable[[Cells], Recomputed],
    recomputed_how: str,
) -> Recomputed:
    """The job's outcome from cells corrected from changes (`applied`), the cells they could not
    correct computed again by `recompute` (on the driver: they are a few named cells)."""
    rows = _rows(applied.changed, by_start, spec)
    changed_pairs = [(by_start[start], entity) for entity, start in applied.changed]
    found = CellOutcome(
        Cells.collect([(w, frozenset([e])) for w, e in changed_pairs], limit=None),
        cells_changed=len(applied.changed),
        cells_skipped=len(applied.unchanged),
        source_rows=0,
    )
    technique = DELTA
    if applied.recompute:
        leftover = Cells.collect(
            [(by_start[start], frozenset([entity])) for entity, start in applied.recompute],
            limit=None,
        )
        again = recompute(leftover)
        try:
            # Named cells: compared on the driver (a first fill is of whole buckets).
            assert isinstance(again.rows, pa.Table) and again.found is not None
            rows = pa.concat_tables([rows, again.rows.select(rows.column_names).cast(rows.schema)])
        finally:
            again.release()
        more = again.found
        found = CellOutcome(
            Cells.collect([*found.cells, *more.cells], limit=None),
            cells_changed=found.cells_changed + more.cells_changed,
            cells_skipped=found.cells_skipped + more.cells_skipped,
            source_rows=more.source_rows,
        )
        technique = f"{DELTA}+{RECOMPUTE}"
        reason += f"; {recomputed_how}: {applied.reasons()}"
    return Recomputed(
        rows,
        found,
        versions,
        technique=technique,
        reason=reason,
        change_rows=applied.change_rows,
        cells_applied=len(applied.changed) + len(applied.unchanged),
        before=before,
    )


def _from_below(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    source: RollupSpec,
    cells: Cells,
    below: LevelChange,
) -> Recomputed:
    """`cells` of a rollup over a rollup corrected from what a job of the level below just
    flipped (`below`): each stored cell takes the old partials of its changed cells below out
    and their new ones in (`model.deltas.merge_into_cells`), without reading the level below.

    Exact when the stored cell reflects the level below as the job found it: no cell below it
    changed between the state the stored row records (its lineage) and the state the job read
    its old partials at, and since then only the job's own cells, still at its generation. A
    cell for which the pointer and row commits in between do not show that, or that the
    changes cannot correct (a retracted extreme, a cell below emptied), is merged again from
    the level below, at the same state of it."""
    lower = engine.rollups.snapshot(source)
    # A bucket queued for every entity (more entities below it changed than a job names per
    # bucket) holds no change but `below`'s: its cells are those of the entities that changed.
    whole = sum(1 for _, scope in cells if scope is None)
    cells = _narrowed(cells, below)
    if cells.named is None or cells.named > CHANGE_CELLS:
        why = f"{cells.named} cells (more than {CHANGE_CELLS})"
        return _merged_again(engine, spark, spec, cells, lower, f"{why}: merged again")
    now = lower.reflects
    since = (
        changed_cells(engine, source, below.read_at, now)
        if below.read_at.at_or_before(now) and _commits_between(below.read_at, now)
        else None
    )
    if since is None:
        return _merged_again(
            engine,
            spark,
            spec,
            cells,
            lower,
            f"what changed in {source.name} since its job read it cannot be told: merged again",
        )
    still = _still_flipped(below, lower)
    by_start = {w.start: w for w in cells.windows}
    keys: list[CellKey] = [(e, w.start) for w, scope in cells for e in sorted(scope or ())]
    spans = merge_windows(list(cells.windows))
    own = engine.rollups.snapshot(spec)
    stored_rows = engine.rollups.read_arrow(
        spec, spans, cells.entities, own, cells=cells, exact=True
    )
    names = [sc.name for sc in spec.stored_columns]
    stored: dict[CellKey, dict] = {}
    states: dict[CellKey, Reflected | None] = {}
    for r in stored_rows.select([*KEYS, *names, "source_versions"]).to_pylist():
        key = (r[ENTITY_COLUMN], r["bucket_start"])
        stored[key] = {n: r[n] for n in names}
        states[key] = _reflected(r["source_versions"], source)
    earlier = _changes_since(engine, source, {s for s in states.values() if s}, below.read_at)
    moves = replacements_above(below.cells, cells.windows)
    mine = _cells_above(below, cells.windows)
    unfit: dict[CellKey, str] = {}
    for key in keys:
        if key not in stored:
            continue  # no stored partial: merged again (merge_into_cells says so)
        entity, start = key
        window = by_start[start]
        state = states[key]
        if state is None:
            unfit[key] = f"the stored row names no state of {source.name}"
            continue
        before = earlier.get(state)
        if before is None or _touched(before, window, entity) != []:
            unfit[key] = f"{source.name} changed below it since it was stored"
            continue
        touched = _touched(since, window, entity)
        if touched is None or any((entity, t) not in below.cells for t in touched):
            unfit[key] = f"{source.name} changed below it other than by the job applied"
            continue
        # Every cell of the job below it must still be as the job left it: a rollback or rewind
        # since may have put a cell back (its pointers then show no difference at all).
        if any(cell not in still for cell in mine.get(key, ())):
            unfit[key] = f"a cell of the job applied was changed again in {source.name}"
    applied = merge_into_cells(
        [k for k in keys if k not in unfit],
        stored,
        moves,
        spec.stored_columns,
        merged_inputs(spec, source),
    )
    applied.recompute.update(unfit)
    if len(applied.recompute) > DRIVER_CELLS:
        return _merged_again(
            engine,
            spark,
            spec,
            cells,
            lower,
            f"{len(applied.recompute)} cells cannot be corrected from {source.name}'s changes "
            f"(more than {DRIVER_CELLS}): merged again",
        )
    reason = below_reason(len(keys), applied.change_rows, source) + (
        f" (generation {below.generation})"
    )
    if whole:
        reason += f"; {whole} bucket(s) queued for every entity: the entities that changed below"
    return _outcome(
        spec,
        applied,
        by_start,
        lower.lineage(source),
        reason,
        (held := Stored(stored_rows, own.reflects)),
        lambda leftover: engine.recompute(spark, spec, leftover, below=lower, stored=held),
        f"merged again from {source.name}",
    )


def _narrowed(cells: Cells, below: LevelChange) -> Cells:
    """`cells` with each bucket for every entity narrowed to the entities of `below`'s cells in
    it (a bucket without any is dropped: nothing below it changed)."""
    if cells.named is not None:
        return cells
    ordered = [w for w, scope in cells if scope is None]
    starts = [w.start for w in ordered]
    entities: dict[Window, set[str]] = {}
    for entity, start in below.cells:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start < ordered[i].end:
            entities.setdefault(ordered[i], set()).add(entity)
    return Cells(
        tuple(
            (w, scope if scope is not None else frozenset(entities[w]))
            for w, scope in cells
            if scope is not None or entities.get(w)
        )
    )


def _merged_again(
    engine: Engine,
    spark: SparkSession,
    spec: RollupSpec,
    cells: Cells,
    lower: Snapshot,
    reason: str,
) -> Recomputed:
    result = engine.recompute(spark, spec, cells, below=lower)
    result.technique = RECOMPUTE
    result.reason = result.reason or reason  # a first fill says what it does instead
    return result


def _commits_between(old: Reflected, new: Reflected) -> bool:
    """Few enough row-table commits between two states of a rollup to read each one?"""
    return new.rows - old.rows <= MAX_BELOW_COMMITS


def _changes_since(
    engine: Engine, spec: RollupSpec, states: set[Reflected], until: Reflected
) -> dict[Reflected, Changed]:
    """For each of `states` of `spec` (the newest `MAX_BELOW_STATES`), the cells that changed
    from it to `until`; a state for which that cannot be told is left out."""
    out: dict[Reflected, Changed] = {}
    newest = sorted(states, key=lambda s: (s.genmap, s.rows), reverse=True)
    for state in newest[:MAX_BELOW_STATES]:
        if not state.at_or_before(until) or not _commits_between(state, until):
            continue
        changed = changed_cells(engine, spec, state, until)
        if changed is not None:
            out[state] = changed
    return out


def _touched(changed: Changed, window: Window, entity: str) -> list[datetime] | None:
    """The bucket starts of `entity`'s cells below `window` that `changed` holds; None when a
    bucket below changed for every entity."""
    out = []
    for w, scope in changed.cells_within([window]):
        if scope is None:
            return None
        if entity in scope:
            out.append(w.start)
    return out


def _still_flipped(below: LevelChange, lower: Snapshot) -> set[CellKey]:
    """The cells of `below` whose active generation in `lower` is still the job's."""
    keys = list(below.cells)
    rows = pa.table(
        {
            ENTITY_COLUMN: pa.array([e for e, _ in keys], pa.string()),
            "bucket_start": pa.array([t for _, t in keys], pa.timestamp("us", tz="UTC")),
            "generation": pa.array([below.generation] * len(keys), pa.int64()),
        }
    )
    active = active_mask(rows, lower.pointers).to_pylist()
    return {k for k, on in zip(keys, active, strict=True) if on}


def merged_inputs(spec: RollupSpec, source: RollupSpec) -> dict[str, str]:
    """Per stored column of `spec`, the column of its rollup `source` it merges."""
    inputs = {}
    for sc in spec.stored_columns:
        column = source.partial_column(sc.column, sc.partial)
        assert column is not None, f"{spec.name}: '{source.name}' lacks {sc.partial}"
        inputs[sc.name] = column
    return inputs


def below_reason(cells: int, replaced: int, source: RollupSpec) -> str:
    return (
        f"{cells} named cell(s): corrected from the old and new partials of {replaced} "
        f"cell(s) of {source.name}"
    )


def replacements_above(
    below: Mapping[CellKey, Replacement], windows: Sequence[Window]
) -> dict[CellKey, list[Replacement]]:
    """The replaced partials of cells below (old, new) by the cell of `windows` above them."""
    out: dict[CellKey, list[Replacement]] = {}
    for above, key in _above(below, windows):
        out.setdefault(above, []).append(below[key])
    return out


def _cells_above(below: LevelChange, windows: Sequence[Window]) -> dict[CellKey, list[CellKey]]:
    """`below`'s cells by the cell of `windows` above them."""
    out: dict[CellKey, list[CellKey]] = {}
    for above, key in _above(below.cells, windows):
        out.setdefault(above, []).append(key)
    return out


def _above(
    below: Mapping[CellKey, object], windows: Sequence[Window]
) -> list[tuple[CellKey, CellKey]]:
    """(cell above, cell below) for each cell of `below` inside one of `windows`."""
    ordered = sorted(windows)
    starts = [w.start for w in ordered]
    out = []
    for entity, start in below:
        i = bisect.bisect_right(starts, start) - 1
        if i >= 0 and start < ordered[i].end:
            out.append(((entity, ordered[i].start), (entity, start)))
    return out


def _reflected(text: str | None, source: RollupSpec) -> Reflected | None:
    """The state of `source` a stored row's lineage (`source_versions`) records."""
    versions = json.loads(text or "{}")
    rows, genmap = versions.get(source.name), versions.get(source.genmap_name)
    if rows is None or genmap is None:
        return None
    return Reflected(int(genmap), int(rows))


def delta_source(
    engine: Engine, spec: RollupSpec, cells: Cells
) -> tuple[str | None, DeltaTable | None]:
    """Why `cells` of `spec` are recomputed rather than corrected from changes (None: they are
    corrected from changes), and the source table they are corrected from (opened once)."""
    source = engine.catalog.archive(spec.source)
    if isinstance(source, RollupSpec):
        return f"source {source.name} is a rollup: cells are merged again from its partials", None
    if cells.named is None:
        whole = sum(1 for _, scope in cells if scope is None)
        return f"{whole} bucket(s) for every entity: aggregated again from their source rows", None
    if cells.named > DRIVER_CELLS:
        return f"{cells.named} cells (more than {DRIVER_CELLS}): aggregated again on Spark", None
    table = engine.raw.table(source)
    if table is None:
        return f"source {source.name} has no table", None
    if table.metadata().configuration.get("delta.enableChangeDataFeed") != "true":
        return f"source {source.name} has no change data feed", None
    return None, table


def _stored_cells(
    rows: pa.Table, spec: RollupSpec, source: str, newest: int
) -> dict[CellKey, StoredCell]:
    """The stored cells with the source version their partials reflect. A row without one, or
    with one past the source's `newest` (read on another table), is left out: it is
    recomputed."""
    names = [sc.name for sc in spec.stored_columns]
    out: dict[CellKey, StoredCell] = {}
    for r in rows.select([*KEYS, *names, "source_versions"]).to_pylist():
        version = json.loads(r["source_versions"] or "{}").get(source)
        if version is None or not 0 <= version <= newest:
            continue
        out[(r[ENTITY_COLUMN], r["bucket_start"])] = StoredCell(
            int(version), {n: r[n] for n in names}
        )
    return out


def _changes(
    changes: pa.Table, time_column: str, windows: tuple[Window, ...], spec: RollupSpec
) -> list[tuple[CellKey, int, Change]]:
    """(cell, commit version, change) for every change row (each lies in one of `windows`)."""
    ordered = sorted(windows)
    starts = [w.start for w in ordered]
    columns = sorted({sc.column for sc in spec.stored_columns})
    out: list[tuple[CellKey, int, Change]] = []
    for r in changes.select(
        [ENTITY_COLUMN, time_column, CHANGE_TYPE, COMMIT_VERSION, *columns]
    ).to_pylist():
        i = bisect.bisect_right(starts, r[time_column]) - 1
        if i < 0 or not ordered[i].start <= r[time_column] < ordered[i].end:
            continue
        out.append(
            (
                (r[ENTITY_COLUMN], ordered[i].start),
                int(r[COMMIT_VERSION]),
                Change(ChangeType(r[CHANGE_TYPE]), {c: r[c] for c in columns}),
            )
        )
    return out


def _rows(
    changed: dict[CellKey, dict], by_start: dict[datetime, Window], spec: RollupSpec
) -> pa.Table:
    """The corrected cells as rollup rows (entity_id, bucket_start, bucket_end, partials)."""
    schema = data_schema(spec)
    names = [ENTITY_COLUMN, "bucket_start", "bucket_end", *[sc.name for sc in spec.stored_columns]]
    wanted = pa.schema([schema.field(n) for n in names])
    rows = []
    for (entity, start), partials in sorted(changed.items()):
        rows.append(
            {ENTITY_COLUMN: entity, "bucket_start": start, "bucket_end": by_start[start].end}
            | partials
        )
    return pa.Table.from_pylist(rows, schema=wanted)
