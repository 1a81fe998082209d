"""A cell's base generation is max(bucket pointer, cell pointer), 0 without either; its base row
of that generation is visible, and its difference rows newer than it and not newer than its
difference pointer: `visible_mask` against a plain-Python reading of that rule."""

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.compute.arrow_types import TS
from rollup_assets.resources.genmap import GENMAP_SCHEMA
from rollup_assets.resources.visible_rows import live_files, visible_mask

T0 = datetime(2025, 3, 30, tzinfo=UTC)


def expected(rows: list[dict], pointers: list[dict]) -> list[bool]:
    out = []
    for r in rows:
        covering = [
            p
            for p in pointers
            if p["bucket_start"] == r["bucket_start"]
            and (p["entity_id"] is None or p["entity_id"] == r["entity_id"])
        ]
        base = max((p["generation"] for p in covering if not p["delta"]), default=0)
        upto = max((p["generation"] for p in covering if p["delta"]), default=0)
        g = r["generation"]
        out.append(base < g <= upto if r.get("delta") else g == base)
    return out


def pointer(
    start: datetime, generation: int, entity: str | None = None, delta: bool = False
) -> dict:
    return {
        "bucket_start": start,
        "bucket_end": start + timedelta(hours=1),
        "entity_id": entity,
        "generation": generation,
        "job_id": "j",
        "run_id": "r",
        "flipped_at": T0,
        "delta": delta,
    }


@pytest.mark.parametrize("seed", range(25))
def test_visible_mask_follows_the_pointer_rule(seed):
    rng = random.Random(seed)
    buckets = [T0 + timedelta(hours=h) for h in range(rng.randint(1, 12))]
    entities = [f"m{i}" for i in range(rng.randint(1, 6))]
    pointers = [
        pointer(rng.choice(buckets), rng.randint(1, 6), rng.choice([None, *entities]))
        for _ in range(rng.randint(0, 15))
    ] + [
        pointer(rng.choice(buckets), rng.randint(1, 6), rng.choice(entities), delta=True)
        for _ in range(rng.randint(0, 10))
    ]
    rows = [
        {"bucket_start": b, "entity_id": e, "generation": g, "delta": d}
        for b in buckets
        for e in entities
        for g in range(7)
        for d in (False, True)
        if rng.random() < 0.5
    ]
    rng.shuffle(rows)
    table = pa.Table.from_pylist(
        rows,
        pa.schema(
            [
                ("bucket_start", TS),
                ("entity_id", pa.string()),
                ("generation", pa.int64()),
                ("delta", pa.bool_()),
            ]
        ),
    )
    mask = visible_mask(table, pa.Table.from_pylist(pointers, GENMAP_SCHEMA))
    assert mask.to_pylist() == expected(rows, pointers)


def file_of(path: str, rows: list[dict]) -> dict:
    """A `file_actions` row for a file holding `rows`, with the statistics a writer records."""
    return {
        "path": path,
        "min.bucket_start": min(r["bucket_start"] for r in rows),
        "max.bucket_start": max(r["bucket_start"] for r in rows),
        "min.generation": min(r["generation"] for r in rows),
        "max.generation": max(r["generation"] for r in rows),
    }


@pytest.mark.parametrize("seed", range(25))
def test_live_files_never_drop_a_file_holding_an_active_row(seed):
    rng = random.Random(seed)
    buckets = [T0 + timedelta(hours=h) for h in range(rng.randint(1, 12))]
    entities = [f"m{i}" for i in range(rng.randint(1, 4))]
    pointers = [
        pointer(rng.choice(buckets), rng.randint(1, 6), rng.choice([None, None, *entities]))
        for _ in range(rng.randint(0, 20))
    ] + [
        pointer(rng.choice(buckets), rng.randint(1, 6), rng.choice(entities), delta=True)
        for _ in range(rng.randint(0, 8))
    ]
    files = {}
    for n in range(rng.randint(1, 8)):
        first = rng.randrange(len(buckets))
        span = buckets[first : first + rng.randint(1, 4)]
        gen = rng.randint(0, 6)
        delta = rng.random() < 0.3
        rows = [
            {"bucket_start": b, "entity_id": e, "generation": gen, "delta": delta}
            for b in span
            for e in entities
            if rng.random() < 0.7
        ]
        if rows:
            files[f"f{n}"] = rows
    table = pa.Table.from_pylist(pointers, GENMAP_SCHEMA)
    kept = {f["path"] for f in live_files([file_of(p, r) for p, r in files.items()], table)}
    for path, rows in files.items():
        if any(expected(rows, pointers)):
            assert path in kept, (path, rows)


def test_live_files_drop_a_file_every_row_of_which_is_superseded():
    hours = [T0 + timedelta(hours=h) for h in range(4)]
    old = [{"bucket_start": b, "entity_id": "m1", "generation": 1} for b in hours]
    pointers = pa.Table.from_pylist(
        [pointer(b, 3) for b in hours] + [pointer(hours[0], 2, "m1")], GENMAP_SCHEMA
    )
    files = [file_of("old", old), file_of("new", [{**r, "generation": 3} for r in old])]
    assert [f["path"] for f in live_files(files, pointers)] == ["new"]
    # A bucket without a global pointer in the file's range: its rows may be active.
    gap = pointers.filter(pc.not_equal(pointers["bucket_start"], pa.scalar(hours[2], TS)))
    assert [f["path"] for f in live_files(files, gap)] == ["old", "new"]
    # No statistics: kept.
    assert live_files([{"path": "bare"}], pointers) == [{"path": "bare"}]
