"""Reading a rollup's surface as the project's own reads do: what versions it reflects
(`reflected`), and the active rows of the rollup's state now (`current_rows`, given the
versions a snapshot would have), for queries, downsampling and real-time reads of every entity.

A surface holds the active rows of the versions it records. When those are the state's (or
older by commits that leave the active rows as they were: `_still_current`), its rows are the
answer; otherwise (it lags, between a flip and the publish that brings it) the caller resolves
the pointers itself. The surface's own state (what it reflects, its columns and files) is kept
per surface until it moves (`LatestCache`): between publishes a read replays no log.
"""

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from rollup_assets.compute.arrow_types import by_start_and_entity
from rollup_assets.model.errors import UnsupportedTableFeatureError
from rollup_assets.model.operations import NO_DATA_OPERATIONS, operation_of
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_files import read_row_groups
from rollup_assets.resources.delta_tables import file_actions, prune_files, read_commit
from rollup_assets.resources.latest_versions import LatestCache
from rollup_assets.resources.rollup_reads import READERS
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.rollup_table import in_windows
from rollup_assets.resources.schemas import PART_COLUMN
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import NEUTRAL_OPERATIONS
from rollup_assets.services.surface_layout import (
    averaged_partials,
    in_current_format,
    in_entity_order,
    in_query_order,
    surface_schema,
)

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
    bucket start and entity (unless not `ordered`: then in the surface's file order, for a
    caller that groups them), read from the surface when it holds exactly the active rows of
    `now` (the versions it records are those, or older by commits that leave the active rows as
    they were: `_still_current`). None when it does not (no surface, one lagging behind the
    rollup, one of other columns or an older format, or one that cannot be read): the caller
    resolves the active rows itself. Raises UnsupportedTableFeatureError when it would read
    files with deletion vectors (another writer's), which its reader does not apply."""
    try:
        return _current_rows(engine, spec, now, window, partials, ordered)
    except (OSError, pa.ArrowException, DeltaError) as exc:
        log.warning("%s: surface not readable (%s); resolving the pointers", spec.name, exc)
        return None


def _current_rows(
    engine: Engine, spec: RollupSpec, now: Reflected, window: Window, partials: bool, ordered: bool
) -> pa.Table | None:
    uri, options = engine.rollups.surface_uri(spec), engine.warehouse.storage_options
    state = surface_state(engine, spec)
    if state is None or state.reflects is None:
        return None
    if not _still_current(engine, spec, state.reflects, now):
        return None
    schema = surface_schema(spec)
    if list(state.names) != schema.names:
        return None
    if state.refusal is not None:
        raise UnsupportedTableFeatureError(*state.refusal)
    cells = ["entity_id", "bucket_start", "bucket_end"]
    averaged = set(averaged_partials(spec))
    names = (
        [*cells, *(c.name for c in spec.stored_columns)]
        if partials
        else [n for n in schema.names if n != PART_COLUMN and n not in averaged]
    )
    logical = pa.schema([schema.field(n) for n in names])
    files = prune_files(
        list(state.files), time_column="bucket_start", spans=[window], entities=None
    )
    # Partitions name UTC days, months or years (their names sort in time order), and a publish
    # writes a partition's rows as files of disjoint entity ranges, each ordered by bucket start,
    # then entity: read in entity order, a partition's files merge into query order on bucket
    # start alone (checked: a file of unknown or overlapping range would break it).
    parts: dict[str, list[dict]] = {}
    for f in files:
        parts.setdefault(str(f.get(f"partition.{PART_COLUMN}")), []).append(f)
    by_part = [in_entity_order(parts[p]) for p in sorted(parts)]
    targets = [(window, None)]

    def read(f: dict) -> pa.Table:
        data = read_row_groups(uri, options, f["path"], logical.names, "bucket_start", targets)
        return data.filter(in_windows(data["bucket_start"], [window])).cast(logical)

    tables = iter(READERS.map(read, [f for group in by_part for f in group]))
    if not ordered:
        # A chunk per file's row group read, without the copy that merging into query order
        # makes.
        return pa.concat_tables([logical.empty_table(), *tables])
    merged = [in_query_order([next(tables) for _ in group]) for group in by_part]
    rows = pa.concat_tables([logical.empty_table(), *merged])
    if not _in_query_order(rows):
        rows = by_start_and_entity(rows)
    return rows


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


def _in_query_order(rows: pa.Table) -> bool:
    """Are `rows` ordered by bucket start, then entity (as a query returns them)?"""
    n = rows.num_rows
    if n < 2:
        return True
    starts = rows["bucket_start"].cast(pa.int64()).to_numpy()
    steps = np.diff(starts)
    if (steps < 0).any():
        return False
    ties = steps == 0
    if not ties.any():
        return True
    entity = rows["entity_id"]
    ascending = pc.greater(entity.slice(1), entity.slice(0, n - 1))
    return bool(np.all(~ties | ascending.to_numpy(zero_copy_only=False)))
