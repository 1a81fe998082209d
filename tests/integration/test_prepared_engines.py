"""A run worker made ready beforehand (`orchestration/launcher.py`) prepares the engines of the
code location it loaded (`resources.prepare_engines`): its run reads only what the ledger gained
since, instead of reading and decoding it whole as a new process would."""

from collections import deque
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.orchestration import resources
from rollup_assets.orchestration.resources import (
    WarehouseResource,
    prepare_engines,
    register_built,
)
from rollup_assets.resources.ledger import Ledger
from rollup_assets.settings import DEFAULT_DRIVER_SOURCE_ROWS
from tests.conftest import World, days

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 9)


def test_a_prepared_worker_folds_only_what_the_ledger_gained_since(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 2, seed=3) for d in days(FIRST, 1)]))
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=1))])
    world.tick(NOW)
    recorded = world.engine.ledger.history("energy_hourly")
    assert recorded

    # The run's resource, made from the same configuration as the code location's.
    run_resource = WarehouseResource(
        root=str(world.root / "warehouse"),
        generation_retention_hours=0,
        retry_attempts=5,
        retry_backoff_seconds=0,
        driver_source_rows=DEFAULT_DRIVER_SOURCE_ROWS,
    )
    # A new process: no engine yet. It prepares the ones of the code location it loaded.
    monkeypatch.setattr(resources, "_ENGINES", resources._Engines())
    monkeypatch.setattr(resources, "_BUILT", deque(maxlen=8))
    register_built(world.catalog, [run_resource])
    register_built(world.catalog, [run_resource])  # built again: registered once
    assert len(resources._BUILT) == 1
    prepare_engines()
    folded: list[int] = []
    fold = Ledger._fold

    def counting(self: Ledger, rows: list[dict], *args, **kwargs):  # type: ignore[no-untyped-def]
        folded.append(len(rows))
        return fold(self, rows, *args, **kwargs)

    monkeypatch.setattr(Ledger, "_fold", counting)
    engine = run_resource.engine(world.catalog)
    before = engine.ledger.snapshot()
    assert folded == []  # what was prepared, as it was
    world.engine.ledger.record([recorded[0].again()])  # another process records a job
    after = engine.ledger.snapshot()
    assert folded == [1]  # only the row it appended
    assert len(after.pending("energy_hourly")) == len(before.pending("energy_hourly")) + 1
