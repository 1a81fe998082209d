"""The `<rollup>__genmap` pointer table: which of a rollup's rows readers see, as stored.

A pointer is `(bucket_start, bucket_end, entity_id, generation, delta)`; `entity_id` null means
every entity of the bucket, and `delta` marks a difference pointer. What the pointers make
visible is `visible_rows`; what a flip (or its rollback) does to them is `flips`. Every change
rewrites the (small) pointer table in one Delta commit (`write_pointer_table`): that commit is
the moment readers switch.

The pointer table also carries the rollup's *fence*: a number (a Delta app transaction,
`FENCE_APP`) that every action invalidating work in flight moves (a rewind, a rollback,
retention, a disable). An action that installs pointers reads the fence before it reads anything
it relies on and commits with `expect=` that value: every commit of the pointer table replaces
its one file, so two commits always conflict and the retried one sees the other's fence. A
stale action fails its commit (`FenceMovedError`) instead of installing pointers to rows that
another action removed. A new pointer table's fence starts at a random number: a rollup deleted
and created again never shows a stale action the fence it read from the deleted table.
"""

import secrets
from collections.abc import Callable, Sequence

import pyarrow as pa
from deltalake import DeltaTable

from rollup_assets.compute.arrow_types import TS, by_start_and_entity
from rollup_assets.model.errors import FenceMovedError
from rollup_assets.model.operations import RETAINED_FROM_KEY
from rollup_assets.resources.delta_commits import CommitPlan, commit, remove_action
from rollup_assets.resources.delta_files import add_action, write_file
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.latest_versions import LatestCache, VersionCache
from rollup_assets.resources.warehouse import filesystem_for

GENMAP_SCHEMA = pa.schema(
    [
        ("bucket_start", TS),
        ("bucket_end", TS),
        ("entity_id", pa.string()),
        ("generation", pa.int64()),
        ("job_id", pa.string()),
        ("run_id", pa.string()),
        ("flipped_at", TS),
        # A difference pointer (`visible_rows`); base pointers are false (or null, when written
        # before difference rows existed).
        ("delta", pa.bool_()),
    ]
)


# The app id of the pointer table's fence (see the module docstring).
FENCE_APP = "rollups.fence"
# The app id under which rollup retention records, in the pointer commit that dropped the
# pointers of the buckets before it, the instant (Unix microseconds) the rollup keeps from.


def _conform(table: DeltaTable) -> pa.Table:
    data = pa.table(table.to_pyarrow_table())
    if "delta" not in data.column_names:
        data = data.append_column("delta", pa.array([False] * data.num_rows, pa.bool_()))
    return data.select(GENMAP_SCHEMA.names).cast(GENMAP_SCHEMA)


def retained_mark(table: DeltaTable | None) -> int:
    """The instant (Unix microseconds) before which rollup retention dropped every pointer of
    a pointer table snapshot (0: it never did)."""
    return 0 if table is None else table.transaction_version(RETAINED_FROM_KEY) or 0


def fresh_fence() -> int:
    """Where a new pointer table's fence starts: a random 62-bit number, so that an action
    still holding the fence of a deleted table of the same name (its rollup deleted and
    created again meanwhile) finds it moved, whatever the new table's commits since."""
    return secrets.randbits(62)


def fence_of(table: DeltaTable | None) -> int | None:
    """The fence of a pointer table snapshot (None: there is no table; 0: a table created
    before fences started afresh, never moved)."""
    return None if table is None else table.transaction_version(FENCE_APP) or 0


# Every read of a rollup reads its pointers; an unchanged pointer table is served from memory.
_POINTERS: LatestCache[tuple[pa.Table, int | None]] = LatestCache(
    lambda t: (_conform(t), fence_of(t))
)
# The pointers of versions read lately (a lagging surface's, and the versions a run read).
_AT: VersionCache[pa.Table] = VersionCache(_conform)


def read_pointers(
    uri: str, storage_options: dict[str, str] | None = None
) -> tuple[pa.Table, int | None]:
    """Every pointer of the pointer table at `uri`, and the version they were read at."""
    latest = _POINTERS.get(uri, storage_options)
    if latest is None:
        return GENMAP_SCHEMA.empty_table(), None
    (pointers, _), version = latest
    return pointers, version


def read_fence(uri: str, storage_options: dict[str, str] | None = None) -> int | None:
    """The fence of the pointer table at `uri` now (None: no table yet)."""
    latest = _POINTERS.get(uri, storage_options)
    return None if latest is None else latest[0][1]


def read_pointers_at(
    uri: str, version: int | None, storage_options: dict[str, str] | None = None
) -> pa.Table:
    """The pointers of the pointer table at `uri` as of `version` (None or negative: before it
    existed, so no pointer)."""
    pointers = (
        None if version is None or version < 0 else pointers_of(uri, version, storage_options)
    )
    return GENMAP_SCHEMA.empty_table() if pointers is None else pointers


def pointers_of(
    uri: str, version: int, storage_options: dict[str, str] | None = None
) -> pa.Table | None:
    """The pointers of version `version` of the pointer table at `uri` (None: no table there),
    kept for the versions read lately."""
    return _AT.get(uri, version, storage_options)


# `write_pointer_table(expect=ANY)`: the commit does not depend on the fence.
ANY = -1


def write_pointer_table(
    uri: str,
    change: Callable[[pa.Table], pa.Table],
    *,
    metadata: dict[str, str],
    storage_options: dict[str, str] | None = None,
    expect: int | None = ANY,
    move: bool = False,
    marks: Sequence[tuple[str, int]] = (),
) -> int:
    """Replace the whole pointer table with `change(current)` in one commit (retried on a
    conflict, `change` then applied to the fresh table). With `expect` (a fence read earlier,
    None for "no table yet"), the commit is a compare-and-set: it raises FenceMovedError,
    committing nothing, when the fence is no longer that value. With `move`, the commit moves
    the fence on: whoever read it before fails its own commit. `marks` are further app
    transactions (app id, version) the commit records (retention's `RETAINED_FROM_KEY`)."""
    fs, root = filesystem_for(uri, storage_options)

    def plan(snapshot: DeltaTable | None) -> CommitPlan:
        fence = fence_of(snapshot)
        if expect != ANY and fence != expect:
            raise FenceMovedError(
                f"{metadata.get('rollups.operation', 'commit')} of {uri}: the pointer table's "
                f"fence moved from {expect} to {fence} since it was read (a rewind, rollback, "
                "retention or disable came in between); nothing was committed"
            )
        current = _conform(snapshot) if snapshot is not None else GENMAP_SCHEMA.empty_table()
        new = by_start_and_entity(change(current))
        add = add_action(write_file(fs, root, "", new, row_group_rows=None))
        removes = [remove_action(a) for a in file_actions(snapshot)] if snapshot is not None else []
        if snapshot is None:
            # A table created (again) under a name starts its fence afresh, never at a value an
            # action may have read from an earlier table of that name (deleted with its rollup).
            start = fresh_fence()
            moved = [(FENCE_APP, start + 1 if move else start)]
        else:
            moved = [(FENCE_APP, (fence or 0) + 1)] if move else []
        return CommitPlan(adds=[add], removes=removes, app_transactions=[*moved, *marks])

    return commit(
        uri, plan, schema=GENMAP_SCHEMA, metadata=metadata, storage_options=storage_options
    )
