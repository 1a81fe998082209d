"""The active generation of a row is max(global pointer of its bucket, pointer of its bucket and
entity), 0 without either: `active_mask` against a plain-Python reading of that rule."""

import random
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest

from resources.genmap import GENMAP_SCHEMA, active_mask

T0 = datetime(2025, 3, 30, tzinfo=UTC)
TS = pa.timestamp("us", tz="UTC")


def expected(rows: list[dict], pointers: list[dict]) -> list[bool]:
    out = []
    for r in rows:
        covering = [
            p["generation"]
            for p in pointers
            if p["bucket_start"] == r["bucket_start"]
            and (p["entity_id"] is None or p["entity_id"] == r["entity_id"])
        ]
        out.append(r["generation"] == max(covering, default=0))
    return out


@pytest.mark.parametrize("seed", range(25))
def test_active_mask_follows_the_pointer_rule(seed):
    rng = random.Random(seed)
    buckets = [T0 + timedelta(hours=h) for h in range(rng.randint(1, 12))]
    entities = [f"m{i}" for i in range(rng.randint(1, 6))]
    pointers = [
        {
            "bucket_start": rng.choice(buckets),
            "bucket_end": T0,
            "entity_id": rng.choice([None, *entities]),
            "generation": rng.randint(1, 6),
            "job_id": "j",
            "run_id": "r",
            "flipped_at": T0,
        }
        for _ in range(rng.randint(0, 15))
    ]
    rows = [
        {"bucket_start": b, "entity_id": e, "generation": g}
        for b in buckets
        for e in entities
        for g in range(7)
        if rng.random() < 0.5
    ]
    rng.shuffle(rows)
    table = pa.Table.from_pylist(
        rows,
        pa.schema([("bucket_start", TS), ("entity_id", pa.string()), ("generation", pa.int64())]),
    )
    mask = active_mask(table, pa.Table.from_pylist(pointers, GENMAP_SCHEMA))
    assert mask.to_pylist() == expected(rows, pointers)
