"""Undoing a flip on the pointer table: every cell the flip covered gets back the active
generation it had just before the flip, every other cell keeps its current one, and a later
flip over one of those cells is found (the rollback is refused then)."""

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from rollup_assets.compute.arrow_types import TS
from rollup_assets.model.cells import Cells
from rollup_assets.model.windows import Window
from rollup_assets.resources.flips import (
    flipped_pointers,
    flipped_since,
    missing_pointers,
    newer_pointers,
    restored_pointers,
)
from rollup_assets.resources.genmap import GENMAP_SCHEMA
from rollup_assets.resources.visible_rows import covered_mask

T0 = datetime(2025, 3, 30, tzinfo=UTC)
BUCKETS = [Window(T0 + timedelta(hours=h), T0 + timedelta(hours=h + 1)) for h in range(6)]
ENTITIES = [f"m{i}" for i in range(4)]
LATER = datetime(2100, 1, 1, tzinfo=UTC)


def active(pointers: pa.Table) -> dict[tuple[datetime, str], int]:
    """The active generation of every cell: max(global pointer, entity pointer), 0 without."""
    out = {}
    rows = pointers.to_pylist()
    for w in BUCKETS:
        for e in ENTITIES:
            gens = [
                p["generation"]
                for p in rows
                if p["bucket_start"] == w.start and p["entity_id"] in (None, e)
            ]
            out[(w.start, e)] = max(gens, default=0)
    return out


def random_cells(rng: random.Random) -> Cells:
    picked = rng.sample(BUCKETS, rng.randint(1, 3))
    return Cells.collect(
        ((w, None if rng.random() < 0.4 else frozenset(rng.sample(ENTITIES, 2))) for w in picked),
        limit=None,
    )


def history(rng: random.Random, flips: int) -> tuple[pa.Table, int]:
    """A pointer table after `flips` random flips (generations 1..flips)."""
    table = GENMAP_SCHEMA.empty_table()
    for g in range(1, flips + 1):
        table = flipped_pointers(table, random_cells(rng), g, f"job{g}", "run")
    return table, flips


def job_pointers(table: pa.Table, job_id: str) -> pa.Table:
    return table.filter(pa.compute.equal(table["job_id"], job_id))


def cells_of(flipped: pa.Table) -> set[tuple[datetime, str]]:
    out = set()
    for p in flipped.to_pylist():
        for e in ENTITIES:
            if p["entity_id"] in (None, e):
                out.add((p["bucket_start"], e))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_undoing_the_newest_flip_gives_back_exactly_what_it_replaced(seed: int) -> None:
    rng = random.Random(seed)
    before, g = history(rng, rng.randint(0, 5))
    after = flipped_pointers(before, random_cells(rng), g + 1, "undo-me", "run")
    flipped = job_pointers(after, "undo-me")
    # Flips of other cells after it stay: they did not touch the job's cells.
    current = after
    for k in range(2):
        other = Cells.collect(
            (w, None)
            for w in BUCKETS
            if not any(p["bucket_start"] == w.start for p in flipped.to_pylist())
        ).restrict(rng.sample(BUCKETS, 2))
        if other:
            current = flipped_pointers(current, other, g + 2 + k, f"later{k}", "run")
    assert newer_pointers(current, flipped, g + 1).num_rows == 0
    assert missing_pointers(current, flipped).num_rows == 0

    restored = restored_pointers(current, before, flipped, LATER)
    was, now_, changed = active(before), active(current), cells_of(flipped)
    got = active(restored)
    assert {c: got[c] for c in changed} == {c: was[c] for c in changed}
    assert {c: got[c] for c in got if c not in changed} == {
        c: now_[c] for c in now_ if c not in changed
    }
    # The pointers given back count as flipped at the rollback (the sweep keeps what they
    # superseded for the retention from then).
    back = flipped_since(restored, LATER - timedelta(microseconds=1))
    assert set(back["job_id"].to_pylist()) <= set(before["job_id"].to_pylist())


@pytest.mark.parametrize("seed", range(20))
def test_a_later_flip_over_one_of_the_cells_is_found(seed: int) -> None:
    rng = random.Random(seed)
    before, g = history(rng, rng.randint(0, 3))
    after = flipped_pointers(before, random_cells(rng), g + 1, "undo-me", "run")
    flipped = job_pointers(after, "undo-me")
    p = rng.choice(flipped.to_pylist())
    entity = p["entity_id"] or rng.choice(ENTITIES)
    scope = None if rng.random() < 0.5 else frozenset([entity])
    cell = Cells.collect([(Window(p["bucket_start"], p["bucket_end"]), scope)], limit=None)
    current = flipped_pointers(after, cell, g + 2, "later", "run")
    assert newer_pointers(current, flipped, g + 1)["job_id"].to_pylist() == ["later"]


def test_covered_mask_follows_global_and_entity_pointers() -> None:
    pointers = pa.Table.from_pylist(
        [
            {"bucket_start": BUCKETS[0].start, "entity_id": None, "generation": 1},
            {"bucket_start": BUCKETS[1].start, "entity_id": "m1", "generation": 2},
        ],
        GENMAP_SCHEMA,
    )
    rows = pa.Table.from_pylist(
        [
            {"bucket_start": BUCKETS[0].start, "entity_id": "m3"},
            {"bucket_start": BUCKETS[1].start, "entity_id": "m1"},
            {"bucket_start": BUCKETS[1].start, "entity_id": "m2"},
            {"bucket_start": BUCKETS[2].start, "entity_id": "m1"},
        ],
        pa.schema([("bucket_start", TS), ("entity_id", pa.string())]),
    )
    assert covered_mask(rows, pointers).to_pylist() == [True, True, False, False]
    assert covered_mask(rows, GENMAP_SCHEMA.empty_table()).to_pylist() == [False] * 4
