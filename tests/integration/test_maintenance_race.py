"""Maintenance against a recompute of the same rollup, interleaved at fixed points (no timing).

Maintenance checks for running recomputes once and holds no writer's slot. The interleaving that
matters: maintenance has checked (nothing running) and read the pointer table; a recompute then
starts, writes and commits the rows of a new generation; maintenance sweeps and reclaims; the
recompute flips its pointers. The new generation's rows must survive, or its buckets would vanish
for readers at the flip.
"""

import threading
from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

import rollup_assets.services.maintenance as maintenance
from rollup_assets import faults
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.services.maintenance import maintain
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 11, 3)
METER = "meter-0002"
WAIT_S = 120


def test_maintenance_between_a_recompute_commit_and_its_flip_keeps_the_new_rows(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=3) for d in days(FIRST, 4)]))
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=4))])
    world.tick(NOW)
    # A first correction gives energy_hourly pointers, so maintenance has something to sweep.
    world.ingest(corrected(FIRST + timedelta(days=1), 2.0), source="Manual")
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []

    world.ingest(corrected(FIRST + timedelta(days=2), 3.0), source="Manual")
    maintenance_read = threading.Event()  # maintenance checked for recomputes, read pointers
    committed = threading.Event()  # the recompute committed its new generation, not flipped
    maintained = threading.Event()

    read_pointers = maintenance.read_pointers

    def read_then_let_the_recompute_commit(uri: str, options: dict | None = None):
        result = read_pointers(uri, options)
        if uri.endswith("energy_hourly__genmap") and not maintenance_read.is_set():
            maintenance_read.set()
            committed.wait(WAIT_S)
        return result

    def commit_then_let_maintenance_sweep(point: str, archive: str | None) -> None:
        if point == "after_commit" and archive == "energy_hourly" and not committed.is_set():
            committed.set()
            maintained.wait(WAIT_S)

    monkeypatch.setattr(maintenance, "read_pointers", read_then_let_the_recompute_commit)
    report = []

    def run_maintenance() -> None:
        try:
            report.append(maintain(world.engine, now=NOW))
        finally:
            maintained.set()

    thread = threading.Thread(target=run_maintenance)
    thread.start()
    assert maintenance_read.wait(WAIT_S)
    with faults.hooked(commit_then_let_maintenance_sweep):
        world.tick(NOW, sensors=("retroactive_write_sensor",))
    thread.join(WAIT_S)
    assert committed.is_set() and report, "the interleaving did not happen"

    assert compare_all(world.query, world.raw(), world.catalog) == []
    hourly = world.query("energy_hourly", entities=[METER])
    assert hourly.num_rows == 4 * 24  # no hour of the meter vanished at the flip


def corrected(day: date, factor: float) -> pa.Table:
    batch = day_batch(day, 3, seed=3)
    one = batch.filter(pc.equal(batch["entity_id"], METER))
    return one.set_column(2, "energy_kwh", pc.multiply(one["energy_kwh"], factor))
