"""The retention spans a raw table's commits record, read once per commit: an archive dropped
and created again under its name starts with none, however far its new log has grown."""

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.resources.raw_store import RawStore
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.settings import DEFAULT_SPECS

ENERGY = load_catalog(DEFAULT_SPECS).raw["energy_raw"]
T0 = datetime(2025, 3, 1, tzinfo=UTC)


def ingest_day(store: RawStore, tmp_path: Path, day: int) -> None:
    path = tmp_path / f"day-{day}.parquet"
    ts = [T0 + timedelta(days=day, minutes=15 * i) for i in range(4)]
    pq.write_table(
        pa.table(
            {
                "entity_id": ["m1"] * len(ts),
                "ts": pa.array(ts, pa.timestamp("us", tz="UTC")),
                "energy_kwh": [1.0] * len(ts),
            }
        ),
        path,
    )
    store.ingest(ENERGY, path, ChangeSource.PIPELINE)


def test_an_archive_created_again_does_not_keep_the_old_tables_retention_spans(
    tmp_path: Path,
) -> None:
    store = RawStore(Warehouse(str(tmp_path / "warehouse")))
    store.ensure_table(ENERGY)
    for day in range(3):
        ingest_day(store, tmp_path, day)
    store.drop_days_before(ENERGY, T0 + timedelta(days=2))
    assert store.retained_spans(ENERGY)  # the drop's span, read and remembered
    old = store.table(ENERGY).version()

    store.drop(ENERGY)
    store.ensure_table(ENERGY)
    day = 10
    while store.table(ENERGY).version() < old:
        ingest_day(store, tmp_path, day)
        day += 1
    assert store.retained_spans(ENERGY) == []
