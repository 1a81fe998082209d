"""FixedSize rollups that are not one cron partition each (issue 36, item 5): a 90-minute
rollup counted from 00:30 UTC over raw readings, and a 2-day rollup counted from 05:00 UTC over
it, in Europe/Vienna, equal the pandas oracle after a backfill, after a late correction the
sensors find, and after a manual run of one partition of a bucket.

Dagster cuts the 90-minute buckets into three half-hour partitions and the 2-day buckets into
48 hours; the data covers both 2025 DST switches, and the corrected bucket holds the repeated
local hour of 2025-10-26 (01:00 to 02:00 UTC). The expected partition keys are written out by
hand from the local times.
"""

from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import partitions_def_for
from tests.conftest import World, day_spans, meter_readings, world_of
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
SPANS = [(date(2025, 3, 28), 4), (date(2025, 10, 24), 5)]
METERS = 4
METER = "meter-0001"
HALF_HOUR = timedelta(minutes=30)
AGGREGATIONS = [
    {"column": "energy_kwh", "function": "Sum"},
    {"column": "energy_kwh", "function": "Count"},
    {"column": "power_kw", "function": "Avg"},
    {"column": "voltage_v", "function": "Min"},
    {"column": "voltage_v", "function": "Max"},
]
VIENNA = {"reference_time_zone": "Europe/Vienna", "aggregations": AGGREGATIONS}
SPECS = {
    "raw_archives": {
        "energy_raw": {
            "columns": {
                "energy_kwh": {"type": "double", "required": True},
                "power_kw": "double",
                "voltage_v": "double",
            }
        }
    },
    "rollups": {
        "meter_90m": {
            **VIENNA,
            "source": "energy_raw",
            "alignment": "FixedSize",
            "size": "90m",
            "origin": "2025-01-01T00:30:00Z",
            "start": "2025-01-01",
        },
        "meter_2d": {
            **VIENNA,
            "source": "meter_90m",
            "alignment": "FixedSize",
            "size": "2d",
            "origin": "2025-01-01T05:00:00Z",  # three 90-minute buckets after 00:30
        },
    },
}
# The 90-minute bucket holding the repeated local hour: 02:30 CEST, then 02:00 and 02:30 CET.
REPEATED = Window(datetime(2025, 10, 26, 0, 30, tzinfo=UTC), datetime(2025, 10, 26, 2, tzinfo=UTC))
REPEATED_KEYS = {"2025-10-26-02:30", "2025-10-26-02:00+0100", "2025-10-26-02:30+0100"}
# 2025-10-24 is 296 days after the 2-day origin's day: [10-24 05:00Z, 10-26 05:00Z) is a
# bucket, 48 hours from 07:00 CEST to 06:00 CET (the local clock shows 49 hour marks).
TWO_DAYS = Window(datetime(2025, 10, 24, 5, tzinfo=UTC), datetime(2025, 10, 26, 5, tzinfo=UTC))


@pytest.fixture
def fixed_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark) -> Iterator[World]:
    yield from world_of(tmp_path, monkeypatch, parse_catalog(SPECS, origin="fixed-size test"))


def materialized(world: World, name: str, after: int = 0, run_id: str | None = None) -> set[str]:
    """Partition keys of `name` materialized after event `after` (by run `run_id`, if given)."""
    records = world.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), after_storage_id=after), limit=10_000
    ).records
    return {
        r.partition_key
        for r in records
        if r.partition_key is not None and (run_id is None or r.run_id == run_id)
    }


def corrected(window: Window, factor: float) -> pa.Table:
    """METER's readings in `window`, with `factor` times the energy (a late correction)."""
    batch = day_batch(
        window.start.date(), METERS, seed=11, missing=0.02, null_power=0.1, null_voltage=0.1
    )
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(window.start, ts.type)),
            pc.less(ts, pa.scalar(window.end, ts.type)),
        ),
    )
    rows = batch.filter(keep)
    return rows.set_column(2, "energy_kwh", pc.multiply(rows["energy_kwh"], factor))


def rows_of(world: World, name: str) -> set[tuple[datetime, datetime]]:
    table = world.query(name, entities=[METER])
    return {(r["bucket_start"], r["bucket_end"]) for r in table.to_pylist()}


def test_90_minute_and_2_day_rollups_equal_the_oracle(fixed_world: World) -> None:
    world = fixed_world
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(meter_readings(SPANS, METERS, seed=11), source="Import")
    world.activate_all(NOW)
    world.backfill(day_spans(SPANS), rollup="meter_90m")  # the run carries meter_2d up itself
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []
    assert (REPEATED.start, REPEATED.end) in rows_of(world, "meter_90m")
    assert (TWO_DAYS.start, TWO_DAYS.end) in rows_of(world, "meter_2d")
    # Every partition of the backfilled buckets was reported, three per 90 minutes.
    assert materialized(world, "meter_90m") >= REPEATED_KEYS

    # A late correction inside the repeated hour: the sensors recompute that 90-minute bucket
    # (all three of its partitions, and nothing else) and the 2-day bucket above it (48 hours).
    marker = world.instance.event_log_storage.get_maximum_record_id() or 0
    late = corrected(Window(REPEATED.start, REPEATED.start + timedelta(hours=1)), 2.0)
    world.ingest(late, source="Manual")
    world.tick(NOW)
    assert materialized(world, "meter_90m", after=marker) == REPEATED_KEYS
    two_days = materialized(world, "meter_2d", after=marker)
    assert len(two_days) == 48
    assert {
        "2025-10-24-07:00",
        "2025-10-26-02:00",
        "2025-10-26-02:00+0100",
        "2025-10-26-05:00",
    } <= two_days
    assert {"2025-10-24-06:00", "2025-10-26-06:00"}.isdisjoint(two_days)  # neighbours' hours
    assert compare_all(world.query, world.raw(), world.catalog) == []
    assert sum(len(r.runs) for r in world.tick(NOW)) == 0  # nothing fires twice

    # A run of one partition (the middle half hour, just corrected again) recomputes its whole
    # bucket, and reports all three partitions.
    middle = Window(REPEATED.start + HALF_HOUR, REPEATED.start + 2 * HALF_HOUR)
    world.ingest(corrected(middle, 3.0), source="Manual")
    pdef = partitions_def_for(world.catalog.rollup("meter_90m"))
    key = pdef.get_partition_key_for_timestamp(middle.start.timestamp())
    assert key == "2025-10-26-02:00+0100"
    run = world.materialize("meter_90m", key, key)
    assert run.success, run.error
    assert materialized(world, "meter_90m", run_id=run.run_id) == REPEATED_KEYS
    (job,) = [j for j in world.engine.ledger.history("meter_90m") if j.run_id == run.run_id]
    raw = world.raw()
    in_bucket = (raw["ts"] >= REPEATED.start) & (raw["ts"] < REPEATED.end)
    assert job.windows == (REPEATED,) and job.source_rows == int(in_bucket.sum())
    world.tick(NOW)  # the sensors see the commit too; the levels stay exact
    assert compare_all(world.query, world.raw(), world.catalog) == []
