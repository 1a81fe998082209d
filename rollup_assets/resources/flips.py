"""What a flip does to a rollup's pointer table (`genmap`), and what undoing it restores: pure
functions of pointer tables, committed by `genmap.write_pointer_table`.

A base flip supersedes every pointer of the cells it covers; a difference flip only the cell's
previous difference pointer (`visible_rows`). A rollback puts back the pointers a flip
superseded, once nothing newer covers its cells and the flip's own pointers are all still there.
"""

from collections.abc import Callable
from datetime import UTC, datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.compute.arrow_types import TS, instants_of
from rollup_assets.model.cells import Cells
from rollup_assets.model.windows import Window
from rollup_assets.resources.genmap import GENMAP_SCHEMA
from rollup_assets.resources.visible_rows import is_delta_pointer


def flipped_since(pointers: pa.Table, since: datetime) -> pa.Table:
    """The pointers flipped after `since`."""
    return pointers.filter(pc.greater(pointers["flipped_at"], pa.scalar(since, TS)))


def buckets_flipped_when(pointers: pa.Table, when: Callable[[datetime], bool]) -> set[datetime]:
    """The starts of the buckets with a pointer whose flip time `when` holds for (asked once per
    distinct flip time: a flip sets the same time on every pointer it writes)."""
    times = pc.unique(pointers["flipped_at"].drop_null()).to_pylist()
    chosen = [t for t in times if when(t)]
    if not chosen:
        return set()
    hit = pc.is_in(pointers["flipped_at"], value_set=pa.array(chosen, TS))
    return set(pc.unique(pointers.filter(hit)["bucket_start"]).to_pylist())


def cell_pointer_counts(pointers: pa.Table, closed_before: datetime | None) -> dict[Window, int]:
    """Per bucket (ending by `closed_before`, when given), how many cell pointers it has."""
    cells = pointers.filter(pc.is_valid(pointers["entity_id"]))
    if closed_before is not None:
        ended = pc.less_equal(cells["bucket_end"], pa.scalar(closed_before, TS))
        cells = cells.filter(pc.fill_null(ended, False))
    counted = cells.group_by(["bucket_start", "bucket_end"]).aggregate([("entity_id", "count")])
    return {
        Window(s, e): n
        for s, e, n in zip(
            instants_of(counted["bucket_start"]),
            instants_of(counted["bucket_end"]),
            counted["entity_id_count"].to_pylist(),
            strict=True,
        )
    }


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
    # One row per pointer made, whole buckets first: each window converted once, its start
    # and end repeated for the entities it names.
    windows = [w for w, scope in cells if scope is None]
    repeats = [1] * len(windows)
    entities: list[str | None] = [None] * len(windows)
    n_whole = len(windows)
    for w, scope in cells:
        if scope is not None and scope:
            windows.append(w)
            repeats.append(len(scope))
            entities += sorted(scope)
    assert not (delta and n_whole), "a difference flip names its cells"
    at = np.repeat(np.arange(len(windows)), repeats)
    starts = pa.array([w.start for w in windows], TS).take(at)
    ends = pa.array([w.end for w in windows], TS).take(at)
    superseded = pc.is_in(current["bucket_start"], value_set=starts.slice(0, n_whole))
    superseded = pc.fill_null(superseded, False).to_numpy(zero_copy_only=False).copy()
    if len(entities) > n_whole and current.num_rows:
        hits = (
            current.select(["bucket_start", "entity_id"])
            .append_column("__i", pa.array(np.arange(current.num_rows), pa.int64()))
            .join(
                pa.table(
                    {
                        "bucket_start": starts.slice(n_whole),
                        "entity_id": pa.array(entities[n_whole:], pa.string()),
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
    n = len(entities)
    new = pa.table(
        {
            "bucket_start": starts,
            "bucket_end": ends,
            "entity_id": pa.array(entities, pa.string()),
            "generation": pa.array(np.full(n, generation, dtype=np.int64)),
            "job_id": pa.array([job_id] * n, pa.string()),
            "run_id": pa.array([run_id] * n, pa.string()),
            "flipped_at": pa.array([datetime.now(UTC)], TS).take(np.zeros(n, dtype=np.int64)),
            "delta": pa.array(np.full(n, delta, dtype=bool)),
        }
    ).cast(GENMAP_SCHEMA)
    return pa.concat_tables([kept, new])


def _cell_keys(pointers: pa.Table) -> tuple[set[datetime], set[tuple[datetime, str]]]:
    """(bucket starts of global pointers, (bucket start, entity) of entity pointers)."""
    whole, named = set(), set()
    for b, e in zip(
        instants_of(pointers["bucket_start"]), pointers["entity_id"].to_pylist(), strict=True
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
