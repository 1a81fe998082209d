"""The whole chain against an independent pandas aggregation of the raw data (issue: rollup assets).

Data covers the Vienna DST switches of 2025 (23 h and 25 h days), the leap day 2024-02-29, month
ends, and ISO week 2025-W01 (which spans the 2024/2025 year end); optional columns have nulls and
some readings are missing.
"""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.model.jobs import Trigger
from rollup_assets.services.maintenance import maintain
from tests.conftest import ON_SPARK, World, day_spans, meter_readings
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
SPANS = [
    (date(2024, 2, 26), 5),
    (date(2024, 12, 28), 10),
    (date(2025, 3, 28), 4),
    (date(2025, 10, 24), 9),
]
METERS = 4


def build_chain(world: World, spans: list[tuple[date, int]] = SPANS, meters: int = METERS) -> None:
    """Readings of `meters` over `spans` (first day, number of days) ingested, every level
    activated at NOW and backfilled over the spans, the rest closed by the forward lane: every
    level then equals pandas. `tests/system/chain_scenario.py` runs it on other deployments."""
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(meter_readings(spans, meters, seed=11), source="Import")
    world.activate_all(NOW)
    world.backfill(day_spans(spans))
    world.tick(NOW)  # forward: close what the backfill did not reach, refresh open buckets
    problems = compare_all(world.query, world.raw(), world.catalog)
    assert problems == []


@pytest.mark.parametrize("world", ["the driver", ON_SPARK], indirect=True)
def test_every_level_equals_pandas(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    build_chain(world)
    daily = world.query("energy_daily")
    starts = {r["bucket_start"].isoformat() for r in daily.select(["bucket_start"]).to_pylist()}
    assert (
        "2025-03-29T23:00:00+00:00" in starts and "2025-10-25T22:00:00+00:00" in starts
    )  # 23 h, 25 h days
    weekly = world.query("energy_weekly", entities=["meter-0000"])
    w01 = [
        r for r in weekly.to_pylist() if r["bucket_start"] == datetime(2024, 12, 29, 23, tzinfo=UTC)
    ]
    assert w01 and w01[0]["bucket_end"] == datetime(2025, 1, 5, 23, tzinfo=UTC)
    # Where the work ran, as each job's plan says: this small archive's on the driver, unless
    # the world sends it to Spark.
    plans = [
        j.plan or ""
        for name in world.catalog.rollups
        for j in world.engine.ledger.history(name, limit=1000)
    ]
    if world.engine.partials.driver_rows == 0:
        assert not [p for p in plans if "on the driver" in p], plans
    else:
        assert [p for p in plans if p.startswith("aggregated again on the driver")], plans
    fold_a_corrected_hour(world, monkeypatch)


def fold_a_corrected_hour(world: World, monkeypatch: pytest.MonkeyPatch) -> None:
    """An hour corrected for every meter (a cell pointer each), folded by maintenance into one
    bucket pointer where the world runs such work; every level still equals pandas."""
    hour = datetime(2025, 10, 28, 7, tzinfo=UTC)  # within the raw retention at NOW
    raw = world.engine.raw.read_arrow(world.catalog.raw["energy_raw"])
    rows = raw.filter(
        pc.and_(
            pc.greater_equal(raw["ts"], pa.scalar(hour, raw["ts"].type)),
            pc.less(raw["ts"], pa.scalar(hour + timedelta(hours=1), raw["ts"].type)),
        )
    ).select(["entity_id", "ts", "energy_kwh"])
    world.ingest(
        rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], 2.0)), source="Manual"
    )
    world.tick(NOW)
    assert hourly_cell_pointers(world, hour) == METERS
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", METERS)
    truth = world.raw()  # maintenance applies the raw retention; the rollups keep their values
    maintain(world.engine, now=NOW)
    folds = [
        j
        for j in world.engine.ledger.snapshot().pending("energy_hourly")
        if j.trigger is Trigger.MAINTENANCE
    ]
    assert len(folds) == 1, folds
    world.tick(NOW)
    done = world.engine.ledger.job(folds[0].job_id)
    # A fold changes no value: the levels above are not aggregated again.
    above = [
        (name, j.windows)
        for name in world.catalog.rollups
        for j in world.engine.ledger.history(name, limit=1000)
        if j.trigger is Trigger.CHAIN and j.created_at >= folds[0].created_at
    ]
    assert above == [], above
    where = "on Spark" if world.engine.partials.driver_rows == 0 else "on the driver"
    assert done is not None and f"read {where}" in (done.plan or ""), done
    assert hourly_cell_pointers(world, hour) == 0
    assert compare_all(world.query, truth, world.catalog) == []


def hourly_cell_pointers(world: World, start: datetime) -> int:
    pointers = world.engine.rollups.snapshot(world.catalog.rollup("energy_hourly")).pointers
    at = pc.equal(pointers["bucket_start"], pa.scalar(start, pointers["bucket_start"].type))
    return pc.sum(pc.is_valid(pointers.filter(at)["entity_id"])).as_py() or 0
