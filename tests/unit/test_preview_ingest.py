"""The dry run of an ingest (`RawStore.preview_ingest`) on delta-rs alone: the rows it says the
upsert would insert or replace are exactly what the ingest then commits, and it writes nothing."""

import math
from datetime import UTC, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from rollup_assets.model.errors import IngestValidationError
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from tests.unit.test_ingest import (
    ENERGY,
    T0,
    as_arrow,
    delta,
    ingest,
    readings,
    stored_rows,
    write_csv,
    write_parquet,
)


@pytest.fixture
def store(tmp_path: Path) -> RawStore:
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(ENERGY)
    return raw


def keyed(rows: list[dict]) -> dict[tuple, dict]:
    out = {}
    for r in rows:
        r = dict(r, ts=r["ts"].astimezone(UTC))
        out[(r["entity_id"], r["ts"])] = r
    return out


def same_rows(a: dict, b: dict) -> bool:
    def eq(x: object, y: object) -> bool:
        if isinstance(x, float) and isinstance(y, float):
            return x == y or (math.isnan(x) and math.isnan(y))
        return x == y

    return a.keys() == b.keys() and all(eq(a[k], b[k]) for k in a)


def check_preview_then_ingest(store: RawStore, path: Path) -> None:
    """Preview `path`, prove nothing was written, ingest it, and compare."""
    before_version, before = delta(store).version(), keyed(stored_rows(store))
    p = store.preview_ingest(ENERGY, path)
    assert delta(store).version() == before_version
    assert keyed(stored_rows(store)) == before
    result = ingest(store, path)
    assert (p.rows, p.inserted, p.updated, p.unchanged) == (
        result.rows,
        result.inserted,
        result.updated,
        result.unchanged,
    )
    after = keyed(stored_rows(store))
    new = keyed(p.new.to_pylist())
    old = keyed(p.old.to_pylist())
    changed = {k for k, r in after.items() if k not in before or not same_rows(r, before[k])}
    assert set(new) == changed
    for k, r in new.items():
        assert same_rows(r, after[k]), (r, after[k])
    assert set(old) == {k for k in changed if k in before}
    for k, r in old.items():
        assert same_rows(r, before[k])


def test_preview_of_changed_equal_and_new_rows_matches_the_ingest(
    store: RawStore, tmp_path: Path
) -> None:
    rows = readings(8)
    ingest(store, write_parquet(tmp_path / "a.parquet", as_arrow(rows)))
    again = [dict(r) for r in rows]
    again[1]["energy_kwh"] += 1.0  # differs
    again[2]["voltage_v"] = None  # an optional null keeps the stored value: unchanged
    again[3]["power_kw"] = 99.0  # differs, and so does the computed current_a
    again += readings(4, start=T0 + timedelta(days=1))  # new rows
    check_preview_then_ingest(store, write_parquet(tmp_path / "b.parquet", as_arrow(again)))


def test_preview_keeps_stored_optional_values_and_recomputes_computed_columns(
    store: RawStore, tmp_path: Path
) -> None:
    a = "entity_id,ts,energy_kwh,power_kw\nm1,2025-01-01T00:00:00Z,1.0,4.0\n"
    ingest(store, write_csv(tmp_path / "a.csv", a))
    # voltage_v arrives alone: power_kw is kept, so current_a = 4.0 * 1000 / 231.
    b = "entity_id,ts,energy_kwh,voltage_v\nm1,2025-01-01T00:00:00Z,1.0,231.0\n"
    check_preview_then_ingest(store, write_csv(tmp_path / "b.csv", b))
    c = pa.table(
        {
            "entity_id": ["m1"],
            "ts": pa.array([T0], pa.timestamp("us", tz="UTC")),
            "energy_kwh": [1.0],
            "power_kw": [math.nan],  # missing: keeps 4.0, so nothing changes
            "voltage_v": pa.array([None], pa.float64()),
        }
    )
    check_preview_then_ingest(store, write_parquet(tmp_path / "c.parquet", c))


def test_a_bad_file_is_refused_as_the_ingest_refuses_it(store: RawStore, tmp_path: Path) -> None:
    bad = write_csv(tmp_path / "bad.csv", "entity_id,ts,energy_kwh\nm1,yesterday,1.0\n")
    version = delta(store).version()
    with pytest.raises(IngestValidationError, match="'yesterday' is not an ISO-8601"):
        store.preview_ingest(ENERGY, bad)
    assert delta(store).version() == version
