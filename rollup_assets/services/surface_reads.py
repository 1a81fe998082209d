"""Reading a rollup's surface as the project's own reads do: what versions it reflects
(`reflected`), and the active rows of the rollup's state now (`rows_now`), for queries,
downsampling and real-time reads of every entity.

A surface holds the active rows of the versions it records. When those are the state's (or
older by commits that leave the active rows as they were: `_still_current`), its rows are the
answer (`current_rows`). While it lags (between a flip and the publish that brings it), the
cells that changed since those versions (`surface_changes.changed_cells`) are read from the row
table and take their old rows' places (`surface_patch`), unless they are a large share of the rows
(then the caller resolves every pointer). The surface's own state (what it reflects, its columns
and files) is kept per surface until it moves (`LatestCache`): between publishes a read replays
no log.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from rollup_assets.compute.arrow_types import by_start_and_entity, is_by_start_and_entity
from rollup_assets.compute.key_index import KeyIndex
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.operations import NO_DATA_OPERATIONS, operation_of
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, micros
from rollup_assets.resources.delta_files import read_row_groups
from rollup_assets.resources.delta_tables import file_actions, prune_files, read_commit
from rollup_assets.resources.latest_versions import LatestCache
from rollup_assets.resources.readers import READERS
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import PART_COLUMN
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import NEUTRAL_OPERATIONS, changed_cells
from rollup_assets.services.surface_fold import folded_on_surface
from rollup_assets.services.surface_layout import (
    averaged_partials,
    fold_state,
    in_current_format,
    in_entity_order,
    in_query_order,
    query_columns,
    surface_schema,
)
from rollup_assets.services.surface_patch import fresh_rows, patched

log = logging.getLogger(__name__)

# Application transactions of a surface commit: the versions of the rollup's tables it reflects.
GENMAP_APP = "rollups.surface.genmap"
ROWS_APP = "rollups.surface.rows"


def reflected(surface: DeltaTable | None) -> Reflected | None:
    """The versions the surface's rows are the active rows of (None: no surface, one that never
    recorded them, or one of an older format, which its next publish rebuilds)."""
    if surface is None or not in_current_format(surface):
        return None
    g, r = surface.transaction_version(GENMAP_APP), surface.transaction_version(ROWS_APP)
    return None if g is None or r is None else Reflected(g, r)


@dataclass(frozen=True)
class SurfaceState:
    """What a read needs of one version of a surface: the versions it reflects (None: none
    recorded, or an older format), its columns, and its files (`file_actions`), or why they
    cannot be read (`refusal`: the table, feature and message of the error a read that would
    use them raises, files with deletion vectors; each read raises an error of its own)."""

    reflects: Reflected | None
    names: tuple[str, ...]
    files: tuple[dict, ...]
    refusal: tuple[str, str, str] | None = None

    @classmethod
    def of(cls, surface: DeltaTable) -> "SurfaceState":
        names = tuple(f.name for f in surface.schema().fields)
        try:
            files = tuple(file_actions(surface))
        except UnsupportedTableFeatureError as exc:
            return cls(reflected(surface), names, (), (exc.table, exc.feature, exc.message))
        return cls(reflected(surface), names, files)


# Each surface's state at its latest version, read again only when the surface has moved: a read
# (or the publish sensor's tick) between publishes costs two file stats, not a log replay.
_STATES: LatestCache[SurfaceState] = LatestCache(SurfaceState.of)


def surface_state(engine: Engine, spec: RollupSpec) -> SurfaceState | None:
    """The state of the rollup's surface at its latest version (None: no surface)."""
    latest = _STATES.get(engine.rollups.surface_uri(spec), engine.warehouse.storage_options)
    return None if latest is None else latest[0]


@dataclass(frozen=True)
class Current:
    """The rows a read of every entity returns, and the versions of the rollup they are the
    active rows of (a query records them as its lineage)."""

    rows: pa.Table
    reflects: Reflected


def rows_now(
    engine: Engine,
    spec: RollupSpec,
    window: Window,
    partials: bool = False,
    ordered: bool = True,
) -> Current | None:
    """What a query of the rollup's state now returns for buckets starting in `window`, every
    entity (`current_rows`' columns and order; not `ordered`, the entity ids of a current
    surface's rows may come dictionary-coded), taken from the surface: as it stands when it is
    current, and while it lags (between a flip and the publish that brings it) with the cells
    that changed since it was published (`surface_changes.changed_cells`) read from the row
    table instead (`surface_patch`): a wave of corrections costs the read its changed cells, not a
    resolution of every pointer. None when the surface cannot answer (none, one of other
    columns or an older format, one that cannot be read, changes that cannot be told or too
    many) or a lagging one has files with deletion vectors (another writer's): the caller
    resolves the active rows itself. Raises UnsupportedTableFeatureError when it would read a
    current surface's files with deletion vectors, which its reader does not apply."""
    try:
        return _rows_now(engine, spec, window, partials, ordered)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.warning("%s: surface not readable (%s); resolving the pointers", spec.name, exc)
        return None


def _rows_now(
    engine: Engine, spec: RollupSpec, window: Window, partials: bool, ordered: bool
) -> Current | None:
    schema = surface_schema(spec)
    state = _readable_state(engine, spec, schema)
    if state is None or state.reflects is None:
        return None
    now = engine.rollups.reflects_now(spec)
    names = _names(spec, partials)
    if _still_current(engine, spec, state.reflects, now):
        rows = _surface_rows(engine, spec, schema, _files(state, window), window, names, ordered)
        return Current(rows, now)
    if state.refusal is not None or now.rows - state.reflects.rows > MAX_PATCHED_COMMITS:
        return None  # resolving the pointers needs no surface, nor its row commits told
    snap = engine.rollups.read_snapshot(spec)
    changed = changed_cells(engine, spec, state.reflects, snap.reflects, snap.pointers)
    if changed is None:
        return None
    files = _files(state, window, skip=changed.whole_buckets)
    pointers = changed.pointers["bucket_start"]
    within = pc.sum(pc.fill_null(in_windows(pointers, [window]), False)).as_py() or 0
    if within > PATCHED_SHARE * sum(_rows_of(f) for f in files):
        return None  # a wave of corrections: resolving every pointer reads as much
    # The changed cells' rows with their partials and fold state: what their folds start from.
    kept = [n for n in (*averaged_partials(spec), *fold_state(spec)) if n not in names]
    cells = changed.pointers.select(["bucket_start", "entity_id"])
    rows, held = _read_surface(engine, spec, schema, files, window, names, ordered, kept, cells)
    folded, rest = folded_on_surface(engine, spec, schema, snap, changed, held, window)
    fresh = by_start_and_entity(
        pa.concat_tables([folded, fresh_rows(engine, spec, schema, snap, rest, window)])
    )
    return Current(patched(rows, changed, fresh, ordered), snap.reflects)


def current_rows(
    engine: Engine,
    spec: RollupSpec,
    now: Reflected,
    window: Window,
    partials: bool = False,
    ordered: bool = True,
) -> pa.Table | None:
    """What a query of the rollup's state `now` (a snapshot's `reflects`) returns for buckets
    starting in `window`, every entity: their logical rows (with `partials`, their stored
    partials: `entity_id`, `bucket_start`, `bucket_end` and `spec.stored_columns`), ordered by
    bucket start and entity (unless not `ordered`: then in the surface's file order, the entity
    ids as each file codes them, a dictionary array, for a caller that groups them), read from
    the surface when it holds exactly the active rows of `now` (the versions it records are
    those, or older by commits that leave the active rows as they were: `_still_current`). None
    when it does not (no surface, one lagging behind the rollup, one of other columns or an
    older format, or one that cannot be read). Raises UnsupportedTableFeatureError when it
    would read files with deletion vectors (another writer's), which its reader does not
    apply."""
    try:
        schema = surface_schema(spec)
        state = _readable_state(engine, spec, schema)
        if state is None or state.reflects is None:
            return None
        if not _still_current(engine, spec, state.reflects, now):
            return None
        names = _names(spec, partials)
        return _surface_rows(engine, spec, schema, _files(state, window), window, names, ordered)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.warning("%s: surface not readable (%s); resolving the pointers", spec.name, exc)
        return None


def _readable_state(engine: Engine, spec: RollupSpec, schema: pa.Schema) -> SurfaceState | None:
    """The surface's state when a read may use it (None: no surface, or one of other columns
    than `schema`, the surface's)."""
    state = surface_state(engine, spec)
    if state is None or list(state.names) != schema.names:
        return None
    return state


def _files_of(state: SurfaceState) -> list[dict]:
    """The state's files; the error of a surface whose files a read cannot apply."""
    if state.refusal is not None:
        raise UnsupportedTableFeatureError(*state.refusal)
    return list(state.files)


def _names(spec: RollupSpec, partials: bool) -> list[str]:
    """The columns of the surface a read returns: the cells and stored partials (`partials`),
    or the logical columns."""
    if partials:
        return ["entity_id", "bucket_start", "bucket_end", *(c.name for c in spec.stored_columns)]
    return query_columns(spec)


def _files(state: SurfaceState, window: Window, skip: Sequence[Window] = ()) -> list[dict]:
    """The surface's files that may hold rows with bucket start in `window`, but those whose
    rows all start in one of `skip` (merged bucket windows)."""
    files = prune_files(_files_of(state), time_column="bucket_start", spans=[window], entities=None)
    return [f for f in files if not _within(f, skip)]


def _rows_of(f: dict) -> int:
    return int(f.get("num_records") or 0)


def _surface_rows(
    engine: Engine,
    spec: RollupSpec,
    schema: pa.Schema,
    files: list[dict],
    window: Window,
    names: list[str],
    ordered: bool,
) -> pa.Table:
    """The rows of the surface's `files` (of `schema`) with bucket start in `window`, in
    `names`; not `ordered`, in file order with the entity ids as each file codes them (grouping
    by the codes spares hashing every id)."""
    return _read_surface(engine, spec, schema, files, window, names, ordered, coded=not ordered)[0]


def _read_surface(
    engine: Engine,
    spec: RollupSpec,
    schema: pa.Schema,
    files: list[dict],
    window: Window,
    names: list[str],
    ordered: bool,
    kept: Sequence[str] = (),
    cells: pa.Table | None = None,
    coded: bool = False,
) -> tuple[pa.Table, pa.Table]:
    """`_surface_rows`, and the rows of `cells` (bucket_start, entity_id) among them in `names`
    and `kept` (in file order): read in the same pass, `kept` only from the files whose
    statistics say they may hold one of `cells`. `coded`: the entity ids as each file codes
    them (dictionary arrays)."""
    uri, options = engine.rollups.surface_uri(spec), engine.warehouse.storage_options
    logical = pa.schema([schema.field(n) for n in names])
    if coded:
        at = logical.get_field_index("entity_id")
        logical = logical.set(at, pa.field("entity_id", pa.dictionary(pa.int32(), pa.string())))
    dictionary = ("entity_id",) if coded else ()
    wide = pa.schema([*logical, *(schema.field(n) for n in kept if n not in names)])
    index = None if cells is None else KeyIndex(cells, ["bucket_start", "entity_id"])
    holds = _Holds(cells)
    # Partitions name UTC days, months or years (their names sort in time order), and a publish
    # writes a partition's rows as files of disjoint entity ranges, each ordered by bucket start,
    # then entity: read in entity order, a partition's files merge into query order on bucket
    # start alone (checked: a file of unknown or overlapping range would break it).
    parts: dict[str, list[dict]] = {}
    for f in files:
        parts.setdefault(str(f.get(f"partition.{PART_COLUMN}")), []).append(f)
    by_part = [in_entity_order(parts[p]) for p in sorted(parts)]
    targets = [(window, None)]

    def read(f: dict) -> tuple[pa.Table, pa.Table]:
        held = index is not None and holds(f)
        columns = wide if held else logical
        data = read_row_groups(
            uri, options, f["path"], columns.names, "bucket_start", targets, dictionary
        )
        if not _within(f, [window]):
            data = data.filter(in_windows(data["bucket_start"], [window]))
        data = data.cast(columns)
        if not held or index is None:
            return data, wide.empty_table()
        return data.select(logical.names), index.rows_of(data)

    read_files = list(READERS.map(read, [f for group in by_part for f in group]))
    held = pa.concat_tables([wide.empty_table(), *(m for _, m in read_files)])
    tables = iter(t for t, _ in read_files)
    if not ordered:
        # A chunk per file's row group read, in file order: no merge into query order.
        return pa.concat_tables([logical.empty_table(), *tables]), held
    merged = [in_query_order([next(tables) for _ in group]) for group in by_part]
    rows = pa.concat_tables([logical.empty_table(), *merged])
    if not is_by_start_and_entity(rows):
        rows = by_start_and_entity(rows)
    return rows, held


class _Holds:
    """Whether a surface file's statistics (bucket start and entity ranges) say it may hold one
    of some cells (bucket_start, entity_id)."""

    def __init__(self, cells: pa.Table | None) -> None:
        named = None if cells is None else cells.filter(pc.is_valid(cells["entity_id"]))
        if named is None or named.num_rows == 0:
            self.starts, self.entities = np.zeros(0, np.int64), np.zeros(0, object)
            return
        order = pc.sort_indices(named["bucket_start"])
        named = named.take(order)
        self.starts = named["bucket_start"].cast(pa.int64()).to_numpy(zero_copy_only=False)
        self.entities = np.array(named["entity_id"].to_pylist(), dtype=object)

    def __call__(self, f: dict) -> bool:
        lo, hi = f.get("min.bucket_start"), f.get("max.bucket_start")
        first, last = f.get("min.entity_id"), f.get("max.entity_id")
        if not isinstance(lo, datetime) or not isinstance(hi, datetime):
            return len(self.starts) > 0
        a = int(np.searchsorted(self.starts, micros(lo), "left"))
        b = int(np.searchsorted(self.starts, micros(hi), "right"))
        if a == b:
            return False
        if not isinstance(first, str) or not isinstance(last, str):
            return True
        entities = self.entities[a:b]
        return bool(np.any((entities >= first) & (entities <= last)))


def _within(f: dict, windows: Sequence[Window]) -> bool:
    """Do the file's statistics put every row's bucket start in one of `windows`?"""
    lo, hi = f.get("min.bucket_start"), f.get("max.bucket_start")
    if lo is None or hi is None:
        return False
    return any(w.start <= lo and hi < w.end for w in windows)


# A lagging surface is read with its changed cells taken from the row table while the pointers
# that changed in the read's range number at most this share of the rows the surface holds there;
# past it (most cells changed since the last publish), resolving every pointer reads as much and
# skips reading the surface.
# Measured on a year of daily rows of 1,000 meters: about 10,000 changed cells read in 0.77x the
# time of resolving the pointers, about 90,000 (a quarter of the rows) in 0.86x.
PATCHED_SHARE = 0.5
# Row-table commits since the surface's publish that a read tells apart at most (one commit file
# each); further behind (its publish failing for a long while), the read resolves the pointers.
MAX_PATCHED_COMMITS = 256


# A query trusts a surface at most this many commits behind the rollup's tables (each one read to
# tell its kind); further behind, it resolves the pointers.
MAX_NEUTRAL_COMMITS = 16


def _still_current(engine: Engine, spec: RollupSpec, done: Reflected, now: Reflected) -> bool:
    """Do the commits after `done` up to `now` leave the active rows as they were? Told from their
    kinds alone: row-table commits that never change them (`NEUTRAL_OPERATIONS`: a recompute's
    invisible rows, sweeps, compaction, vacuum) and pointer-table commits that change no pointer
    (compaction, vacuum, checkpoints)."""
    if done == now:
        return True
    behind = (now.genmap - done.genmap) + (now.rows - done.rows)
    if done.genmap > now.genmap or done.rows > now.rows or behind > MAX_NEUTRAL_COMMITS:
        return False
    options = engine.warehouse.storage_options
    commits = [
        *(
            (engine.rollups.genmap_uri(spec), v, NO_DATA_OPERATIONS)
            for v in range(done.genmap + 1, now.genmap + 1)
        ),
        *(
            (engine.rollups.uri(spec), v, NEUTRAL_OPERATIONS)
            for v in range(done.rows + 1, now.rows + 1)
        ),
    ]
    for uri, version, neutral in commits:
        try:
            actions = read_commit(uri, version, options)
        except (OSError, ValueError):
            return False
        info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if operation_of(info) not in neutral:
            return False
    return True
