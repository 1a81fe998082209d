"""An ingest's MERGE reads only the raw files that may hold the batch's rows: per UTC day, the
batch's entities there (listed, or their range past a budget), written as literals both
engines read alike."""

import os
import re
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import DAY_COLUMN, ENTITY_COLUMN
from rollup_assets.resources import batches
from rollup_assets.resources.batches import DayEntities, day_entities
from rollup_assets.resources.delta_tables import file_actions
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.upsert import PRUNABLE_IN_LIST, upsert_clauses
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.settings import DEFAULT_SPECS

ENERGY = load_catalog(DEFAULT_SPECS).raw["energy_raw"]
DAY = date(2025, 3, 4)
T0 = datetime(2025, 3, 4, tzinfo=UTC)


def keys(pairs: list[tuple[date, str]]) -> pa.Table:
    return pa.table(
        {
            DAY_COLUMN: pa.array([d for d, _ in pairs], pa.date32()),
            ENTITY_COLUMN: pa.array([e for _, e in pairs], pa.string()),
        }
    )


def test_a_batch_lists_each_days_entities_and_ranges_them_past_the_budget() -> None:
    other = DAY + timedelta(days=1)
    rows = keys([(DAY, "m2"), (DAY, "m1"), (DAY, "m2"), (other, "m9"), (other, "m3")])
    assert day_entities(rows, 4) == (
        DayEntities(DAY, "m1", "m2", ("m1", "m2")),
        DayEntities(other, "m3", "m9", ("m3", "m9")),
    )
    # Four distinct (day, entity) cells: a budget of three keeps only each day's range.
    assert day_entities(rows, 3) == (
        DayEntities(DAY, "m1", "m2", None),
        DayEntities(other, "m3", "m9", None),
    )


def test_the_predicate_names_each_days_entities_in_prunable_lists() -> None:
    names = tuple(f"m{i:03}" for i in range(PRUNABLE_IN_LIST * 2 + 1))
    days = [DAY + timedelta(days=i) for i in range(5)]
    cells = [DayEntities(d, names[0], names[-1], names) for d in days]
    predicate = upsert_clauses(ENERGY, days, cells).predicate
    lists = re.findall(r"entity_id IN \(([^)]*)\)", predicate)
    assert len(lists) == 3 * len(days)
    assert max(len(x.split(",")) for x in lists) == PRUNABLE_IN_LIST
    for d in days:
        assert f"t.day = '{d.isoformat()}'" in predicate
    # Thousands of days nest as a balanced tree: about log2 of them deep.
    many = [DayEntities(DAY + timedelta(days=i), "a", "a", ("a",)) for i in range(4096)]
    deep = upsert_clauses(ENERGY, [c.day for c in many], many).predicate
    depth = level = 0
    for ch in deep:
        level += {"(": 1, ")": -1}.get(ch, 0)
        depth = max(depth, level)
    assert depth <= 16


def test_entities_are_quoted_as_literals_and_a_backslash_keeps_the_whole_day() -> None:
    quoted = upsert_clauses(ENERGY, [DAY], [DayEntities(DAY, "o'brien", "o'brien", ("o'brien",))])
    assert "IN ('o''brien')" in quoted.predicate
    slashed = upsert_clauses(ENERGY, [DAY], [DayEntities(DAY, "a\\b", "z", None)])
    assert "entity_id BETWEEN" not in slashed.predicate
    assert f"t.day = '{DAY.isoformat()}'" in slashed.predicate


@pytest.fixture
def store(tmp_path: Path) -> RawStore:
    raw = RawStore(Warehouse(str(tmp_path / "warehouse")))
    raw.ensure_table(ENERGY)
    return raw


def readings(entities: list[str], energy: float, slots: int = 4) -> pa.Table:
    rows = [(e, T0 + timedelta(minutes=15 * s)) for e in entities for s in range(slots)]
    return pa.table(
        {
            "entity_id": pa.array([e for e, _ in rows], pa.string()),
            "ts": pa.array([t for _, t in rows], pa.timestamp("us", tz="UTC")),
            "energy_kwh": pa.array([energy] * len(rows)),
        }
    )


def ingest(store: RawStore, tmp_path: Path, table: pa.Table, name: str):
    path = tmp_path / f"{name}.parquet"
    pq.write_table(table, path)
    return store.ingest(ENERGY, path, ChangeSource.PIPELINE)


def test_an_upsert_does_not_read_the_days_files_of_other_entities(
    store: RawStore, tmp_path: Path
) -> None:
    ingest(store, tmp_path, readings(["a1", "a2"], 1.0), "first")
    ingest(store, tmp_path, readings(["z1", "z2"], 1.0), "second")
    others = [
        f["path"] for f in file_actions(DeltaTable(store.uri(ENERGY))) if f["min.entity_id"] == "z1"
    ]
    assert len(others) == 1
    # The other entities' file is gone from storage: a MERGE that read it would fail.
    os.remove(os.path.join(store.uri(ENERGY), others[0]))
    result = ingest(store, tmp_path, readings(["a2"], 5.0), "update")
    assert (result.inserted, result.updated) == (0, 4)


@pytest.mark.parametrize("listed_at_most", [batches.LISTED_CELLS, 0])
def test_upserts_of_awkward_and_many_entities_update_in_place(
    store: RawStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, listed_at_most: int
) -> None:
    monkeypatch.setattr(batches, "LISTED_CELLS", listed_at_most)
    awkward = ["o'brien", "a\\b", "zähler", "x y", "'"]
    many = [f"m{i:02}" for i in range(45)]
    # Each awkward entity in a file of its own: a literal that missed it would skip its file,
    # and the update would land as a second row with the same key.
    for n, name in enumerate(awkward):
        ingest(store, tmp_path, readings([name], 1.0), f"first-{n}")
    ingest(store, tmp_path, readings(many, 1.0), "many")
    for n, name in enumerate(awkward):
        result = ingest(store, tmp_path, readings([name], 2.0), f"again-{n}")
        assert (result.inserted, result.updated) == (0, 4), name
    result = ingest(store, tmp_path, readings(many, 2.0), "many-again")
    assert (result.inserted, result.updated) == (0, 4 * len(many))
    stored = DeltaTable(store.uri(ENERGY)).to_pyarrow_table()
    assert stored.num_rows == 4 * (len(awkward) + len(many))
    assert set(stored["energy_kwh"].to_pylist()) == {2.0}
