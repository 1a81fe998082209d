"""The `<rollup>__genmap` pointer table: which of a rollup's rows readers see.

A rollup's row table holds *base* rows (a cell's state: partials and companions) and
*difference* rows (a change of a cell's values: `compute.folding`), of every generation. A
pointer is `(bucket_start, bucket_end, entity_id, generation, delta)`; `entity_id` null means
every entity of the bucket.

  * A base pointer says which generation's base row a cell shows: the newest base pointer
    covering it, i.e. max(bucket pointer, entity pointer), and 0 when none covers it (the
    forward lane's rows). Only that generation's base row is visible: a cell the flip left
    without a row (its source rows all gone) shows none, whatever older rows hold.
  * A difference pointer (always a cell's own) says up to which generation the cell's
    difference rows are visible: those newer than its base and not newer than the pointer. A
    read folds them into the base (`compute.folding.fold`).

Generations only grow, so "newest" is "largest"; `visible_mask` (Arrow) and
`resolve_visible_spark` (Spark) are the two readings of that rule. Flipping rewrites the
(small) pointer table in one Delta commit: that commit is the moment readers switch. A base
flip supersedes every pointer of the cells it covers; a difference flip only the cell's
previous difference pointer.

The pointer table also carries the rollup's *fence*: a number (a Delta app transaction,
`FENCE_APP`) that every action invalidating work in flight moves (a rewind, a rollback,
retention, a disable). An action that installs pointers reads the fence before it reads anything
it relies on and commits with `expect=` that value: every commit of the pointer table replaces
its one file, so two commits always conflict and the retried one sees the other's fence. A
stale action fails its commit (`FenceMovedError`) instead of installing pointers to rows that
another action removed.
"""

from collections.abc import Callable, Sequence
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.cells import Cells
from rollup_assets.model.errors import FenceMovedError
from rollup_assets.model.windows import micros
from rollup_assets.resources.delta_commits import CommitPlan, commit, remove_action
from rollup_assets.resources.delta_files import add_action, write_file
from rollup_assets.resources.delta_tables import file_actions, open_table
from rollup_assets.resources.latest_versions import LatestCache
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
        # A difference pointer (see the module); base pointers are false (or null, when written
        # before difference rows existed).
        ("delta", pa.bool_()),
    ]
)


# The app id of the pointer table's fence (see the module docstring).
FENCE_APP = "rollups.fence"
# The app id under which rollup retention records, in the pointer commit that dropped the
# pointers of the buckets before it, the instant (Unix microseconds) the rollup keeps from.
RETAINED_APP = "rollups.retained_from"


def _conform(table: DeltaTable) -> pa.Table:
    data = pa.table(table.to_pyarrow_table())
    if "delta" not in data.column_names:
        data = data.append_column("delta", pa.array([False] * data.num_rows, pa.bool_()))
    return data.select(GENMAP_SCHEMA.names).cast(GENMAP_SCHEMA)


def retained_mark(table: DeltaTable | None) -> int:
    """The instant (Unix microseconds) before which rollup retention dropped every pointer of
    a pointer table snapshot (0: it never did)."""
    return 0 if table is None else table.transaction_version(RETAINED_APP) or 0


def fence_of(table: DeltaTable | None) -> int | None:
    """The fence of a pointer table snapshot (None: there is no table; 0: never moved)."""
    return None if table is None else table.transaction_version(FENCE_APP) or 0


# Every read of a rollup reads its pointers; an unchanged pointer table is served from memory.
_POINTERS: LatestCache[tuple[pa.Table, int | None]] = LatestCache(
    lambda t: (_conform(t), fence_of(t))
)


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
    table = None if version is None or version < 0 else open_table(uri, storage_options, version)
    return GENMAP_SCHEMA.empty_table() if table is None else _conform(table)


def is_delta_pointer(pointers: pa.Table) -> pa.ChunkedArray:
    """Mask: is each pointer a difference pointer?"""
    return pc.fill_null(pointers["delta"], False)


def base_pointers(pointers: pa.Table) -> pa.Table:
    return pointers.filter(pc.invert(is_delta_pointer(pointers)))


def split_pointers(pointers: pa.Table) -> tuple[pa.Table, pa.Table]:
    """Of the base pointers: (bucket pointers: bucket_start, g_all), (cell pointers:
    bucket_start, entity_id, g_entity), the newest of each."""
    pointers = base_pointers(pointers)
    is_global = pc.is_null(pointers["entity_id"])
    g = pointers.filter(is_global).group_by("bucket_start").aggregate([("generation", "max")])
    g = g.rename_columns(["bucket_start", "g_all"])
    s = (
        pointers.filter(pc.invert(is_global))
        .group_by(["bucket_start", "entity_id"])
        .aggregate([("generation", "max")])
    )
    s = s.rename_columns(["bucket_start", "entity_id", "g_entity"])
    return g, s


def delta_pointers(pointers: pa.Table) -> pa.Table:
    """The difference pointers: bucket_start, entity_id, g_delta (the newest per cell)."""
    d = pointers.filter(is_delta_pointer(pointers))
    d = d.group_by(["bucket_start", "entity_id"]).aggregate([("generation", "max")])
    return d.rename_columns(["bucket_start", "entity_id", "g_delta"])


def live_files(files: list[dict], pointers: pa.Table) -> list[dict]:
    """`files` (rows of `file_actions` of a rollup's row table) less those whose every row is
    superseded, told from statistics alone: a file whose newest generation is older than the
    bucket base pointer of every bucket from its first to its last (contiguous bucket pointers,
    so no bucket between them lacks one). A visible row's generation is at least its bucket's
    base pointer, so none of that file's rows can be visible. A file without statistics is
    kept."""
    pointers = base_pointers(pointers)
    is_global = pc.is_null(pointers["entity_id"])
    if not pointers.num_rows or not pc.any(is_global).as_py():
        return files
    g = (
        pointers.filter(is_global)
        .group_by(["bucket_start", "bucket_end"])
        .aggregate([("generation", "max")])
        .sort_by("bucket_start")
    )
    starts = g["bucket_start"].cast(TS).cast(pa.int64()).to_numpy()
    ends = g["bucket_end"].cast(TS).cast(pa.int64()).to_numpy()
    gens = g["generation_max"].to_numpy()
    # gaps[k]: how many neighbouring pointers before pointer k do not meet (a bucket between
    # them has no global pointer).
    gaps = np.concatenate([[0], np.cumsum(ends[:-1] != starts[1:])])
    out = []
    for f in files:
        lo, hi, newest = (
            f.get("min.bucket_start"),
            f.get("max.bucket_start"),
            f.get("max.generation"),
        )
        if lo is None or hi is None or newest is None:
            out.append(f)
            continue
        i = int(np.searchsorted(starts, micros(lo), side="left"))
        j = int(np.searchsorted(starts, micros(hi), side="right")) - 1
        covered = (
            i <= j
            and starts[i] == micros(lo)
            and starts[j] == micros(hi)
            and gaps[j] == gaps[i]
            and gens[i : j + 1].min() > newest
        )
        if not covered:
            out.append(f)
    return out


def visible_mask(rows: pa.Table, pointers: pa.Table) -> pa.ChunkedArray:
    """For rows with (bucket_start, entity_id, generation, and `delta` when difference rows may
    be among them): is each row visible (see the module)? A base row when its generation is its
    cell's base pointer, a difference row when newer than that and not newer than its cell's
    difference pointer."""
    n = rows.num_rows
    if n == 0:
        return pa.chunked_array([pa.array([], pa.bool_())])
    base = base_generation(rows, pointers)
    generation = rows["generation"].to_numpy(zero_copy_only=False)
    if "delta" not in rows.column_names:
        return pa.chunked_array([pa.array(generation == base, pa.bool_())])
    is_delta = pc.fill_null(rows["delta"], False).to_numpy(zero_copy_only=False)
    visible = ~is_delta & (generation == base)
    if is_delta.any():
        upto = _delta_generation(rows, pointers)
        visible |= is_delta & (generation > base) & (generation <= upto)
    return pa.chunked_array([pa.array(visible, pa.bool_())])


def base_generation(rows: pa.Table, pointers: pa.Table) -> np.ndarray:
    """Per row (bucket_start, entity_id), its cell's base pointer (0 without one)."""
    if pointers.num_rows == 0:
        return np.zeros(rows.num_rows, dtype=np.int64)
    g, s = split_pointers(pointers)
    starts = rows["bucket_start"].cast(TS)
    # Bucket pointers: a lookup by bucket start, in row order (no join, no re-sort).
    at = pc.index_in(starts, value_set=g["bucket_start"])
    base = pc.fill_null(pc.take(g["g_all"], at), 0).to_numpy().copy()
    if s.num_rows:
        _raise_at(base, rows, starts, s, "g_entity")
    return base


def _delta_generation(rows: pa.Table, pointers: pa.Table) -> np.ndarray:
    """Per row, its cell's difference pointer (0 without one)."""
    upto = np.zeros(rows.num_rows, dtype=np.int64)
    d = delta_pointers(pointers) if pointers.num_rows else pointers
    if d.num_rows:
        _raise_at(upto, rows, rows["bucket_start"].cast(TS), d, "g_delta")
    return upto


def _raise_at(
    values: np.ndarray, rows: pa.Table, starts: pa.ChunkedArray, cells: pa.Table, column: str
) -> None:
    """values[i] = max(values[i], cells' `column` of row i's cell), for the rows of those cells
    (few: the corrected entities), joined on (bucket_start, entity_id)."""
    candidates = pc.is_in(rows["entity_id"], value_set=pc.unique(cells["entity_id"]))
    picked = pc.indices_nonzero(candidates)
    if not len(picked):
        return
    keyed = pa.table(
        {
            "__i": picked,
            "bucket_start": pc.take(starts, picked),
            "entity_id": pc.take(rows["entity_id"], picked),
        }
    ).join(cells, ["bucket_start", "entity_id"], join_type="inner")
    if keyed.num_rows:
        i = keyed["__i"].to_numpy()
        values[i] = np.maximum(values[i], keyed[column].to_numpy())


def covered_mask(rows: pa.Table, pointers: pa.Table) -> pa.ChunkedArray:
    """For rows with (bucket_start, entity_id): does one of `pointers` cover each row's cell (a
    global pointer of its bucket, or an entity pointer of its bucket and entity)?"""
    n = rows.num_rows
    if n == 0 or pointers.num_rows == 0:
        return pa.chunked_array([pa.array(np.zeros(n, dtype=bool), pa.bool_())])
    is_global = pc.is_null(pointers["entity_id"])
    g = pointers.filter(is_global)
    s = pointers.filter(pc.invert(is_global)).group_by(["bucket_start", "entity_id"]).aggregate([])
    starts = rows["bucket_start"].cast(TS)
    covered = pc.fill_null(pc.is_in(starts, value_set=g["bucket_start"]), False)
    mask = covered.to_numpy(zero_copy_only=False).copy()
    if s.num_rows:
        keyed = pa.table(
            {
                "__i": pa.array(np.arange(n), pa.int64()),
                "bucket_start": starts,
                "entity_id": rows["entity_id"],
            }
        ).join(
            s.select(["bucket_start", "entity_id"]),
            ["bucket_start", "entity_id"],
            join_type="inner",
        )
        mask[keyed["__i"].to_numpy()] = True
    return pa.chunked_array([pa.array(mask, pa.bool_())])


def flipped_since(pointers: pa.Table, since: datetime) -> pa.Table:
    """The pointers flipped after `since`."""
    return pointers.filter(pc.greater(pointers["flipped_at"], pa.scalar(since, TS)))


def flipped_pointers(
    current: pa.Table,
    cells: Cells,
    generation: int,
    job_id: str,
    run_id: str,
    *,
    delta: bool = False,
) -> pa.Table:
    """The pointer table after `generation` is flipped on `cells`.

    A base flip (`delta` false): a bucket pointer for a bucket covering every entity, a cell
    pointer for each named cell; every pointer of the cells it covers is superseded (their
    difference rows are folded into the new base, or gone with it). A difference flip: a
    difference pointer per named cell (never every entity), superseding only the cell's
    previous difference pointer. Superseded pointers are dropped, so the table keeps one bucket
    pointer per bucket at most, plus cell pointers newer than it.
    """
    whole = [w for w, scope in cells if scope is None]
    named = [(w, e) for w, scope in cells if scope is not None for e in sorted(scope)]
    assert not (delta and whole), "a difference flip names its cells"
    superseded = pc.is_in(current["bucket_start"], value_set=pa.array([w.start for w in whole], TS))
    superseded = pc.fill_null(superseded, False).to_numpy(zero_copy_only=False).copy()
    if named and current.num_rows:
        hits = (
            current.select(["bucket_start", "entity_id"])
            .append_column("__i", pa.array(np.arange(current.num_rows), pa.int64()))
            .join(
                pa.table(
                    {
                        "bucket_start": pa.array([w.start for w, _ in named], TS),
                        "entity_id": pa.array([e for _, e in named], pa.string()),
                    }
                ),
                ["bucket_start", "entity_id"],
                join_type="inner",
            )
        )
        hit = hits["__i"].to_numpy()
        if delta:
            # Only the cells' previous difference pointers: their base pointers stay.
            hit = hit[is_delta_pointer(current).to_numpy(zero_copy_only=False)[hit]]
        superseded[hit] = True
    kept = current.filter(pa.array(~superseded, pa.bool_()))
    now = datetime.now(UTC)
    new = pa.Table.from_pylist(
        [
            {
                "bucket_start": w.start,
                "bucket_end": w.end,
                "entity_id": e,
                "generation": generation,
                "job_id": job_id,
                "run_id": run_id,
                "flipped_at": now,
                "delta": delta,
            }
            for w, e in [*((w, None) for w in whole), *named]
        ],
        schema=GENMAP_SCHEMA,
    )
    return pa.concat_tables([kept, new])


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
    transactions (app id, version) the commit records (retention's `RETAINED_APP`)."""
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
        new = change(current).sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
        add = add_action(write_file(fs, root, "", new, row_group_rows=None))
        removes = [remove_action(a) for a in file_actions(snapshot)] if snapshot is not None else []
        moved = [(FENCE_APP, (fence or 0) + 1)] if move else []
        return CommitPlan(adds=[add], removes=removes, app_transactions=[*moved, *marks])

    return commit(
        uri, plan, schema=GENMAP_SCHEMA, metadata=metadata, storage_options=storage_options
    )


def resolve_visible_spark(spark: SparkSession, rows: DataFrame, pointers: pa.Table) -> DataFrame:
    """Keep the visible rows (`visible_mask`): a base row of its cell's base pointer's
    generation, a difference row newer than that and not newer than its difference pointer."""
    if pointers.num_rows == 0:
        return rows.where((F.col("generation") == 0) & ~F.coalesce(F.col("delta"), F.lit(False)))
    g, s = split_pointers(pointers)
    d = delta_pointers(pointers)
    out = rows
    base = F.lit(0)
    if g.num_rows:
        out = out.join(F.broadcast(spark.createDataFrame(g)), on="bucket_start", how="left")
        base = F.greatest(base, F.coalesce(F.col("g_all"), F.lit(0)))
    if s.num_rows:
        out = out.join(
            F.broadcast(spark.createDataFrame(s)), on=["bucket_start", "entity_id"], how="left"
        )
        base = F.greatest(base, F.coalesce(F.col("g_entity"), F.lit(0)))
    is_delta = F.coalesce(F.col("delta"), F.lit(False))
    visible = ~is_delta & (F.col("generation") == base)
    if d.num_rows:
        out = out.join(
            F.broadcast(spark.createDataFrame(d)), on=["bucket_start", "entity_id"], how="left"
        )
        upto = F.coalesce(F.col("g_delta"), F.lit(0))
        visible = visible | (
            is_delta & (F.col("generation") > base) & (F.col("generation") <= upto)
        )
    cols = rows.columns
    return out.where(visible).select(*cols)


def _cell_keys(pointers: pa.Table) -> tuple[set[datetime], set[tuple[datetime, str]]]:
    """(bucket starts of global pointers, (bucket start, entity) of entity pointers)."""
    whole, named = set(), set()
    for b, e in zip(
        pointers["bucket_start"].to_pylist(), pointers["entity_id"].to_pylist(), strict=True
    ):
        if e is None:
            whole.add(b)
        else:
            named.add((b, e))
    return whole, named


def newer_pointers(current: pa.Table, flipped: pa.Table, generation: int) -> pa.Table:
    """The pointers of `current` newer than `generation` that cover a cell of `flipped` (a flip's
    pointers): the flips that changed those cells again since."""
    whole, named = _cell_keys(flipped)
    buckets = whole | {b for b, _ in named}
    keep = []
    for p in current.to_pylist():
        if p["generation"] <= generation:
            continue
        b, e = p["bucket_start"], p["entity_id"]
        if (e is None and b in buckets) or (e is not None and (b in whole or (b, e) in named)):
            keep.append(p)
    return pa.Table.from_pylist(keep, schema=GENMAP_SCHEMA)


def missing_pointers(current: pa.Table, flipped: pa.Table) -> pa.Table:
    """The pointers of `flipped` that `current` no longer holds."""
    have = {
        (p["bucket_start"], p["entity_id"], p["generation"])
        for p in current.select(["bucket_start", "entity_id", "generation"]).to_pylist()
    }
    rows = [
        p
        for p in flipped.to_pylist()
        if (p["bucket_start"], p["entity_id"], p["generation"]) not in have
    ]
    return pa.Table.from_pylist(rows, schema=GENMAP_SCHEMA)


def restored_pointers(
    current: pa.Table, before: pa.Table, flipped: pa.Table, now: datetime
) -> pa.Table:
    """The pointer table after undoing a flip: `current` without the flip's pointers
    (`flipped`), with the pointers the flip superseded (those of `before`, the table just
    before the flip, on its cells) back, stamped as flipped `now`.

    A flip of a whole bucket dropped every pointer of that bucket; a flip of named cells dropped
    the entity pointers of those cells only. Call it only when no newer flip covers one of
    those cells (`newer_pointers` is empty) and `current` still holds every pointer of the flip
    (`missing_pointers` is empty): then each cell's active generation is the one of `before`."""
    whole, named = _cell_keys(flipped)
    undone = {
        (p["bucket_start"], p["entity_id"], p["generation"])
        for p in flipped.select(["bucket_start", "entity_id", "generation"]).to_pylist()
    }
    kept = [
        p
        for p in current.to_pylist()
        if (p["bucket_start"], p["entity_id"], p["generation"]) not in undone
    ]
    back = [
        {**p, "flipped_at": now}
        for p in before.to_pylist()
        if p["bucket_start"] in whole
        or (p["entity_id"] is not None and (p["bucket_start"], p["entity_id"]) in named)
    ]
    return pa.Table.from_pylist([*kept, *back], schema=GENMAP_SCHEMA)
