"""A late correction is detected and propagated to exactly the affected partitions of
every level."""

from collections import defaultdict
from datetime import UTC, date, datetime, timedelta

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.windows import Window
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 7, 28)
DAYS = 110
METER = "meter-0002"
# The local (Vienna) day 2025-08-14 is 2025-08-13 22:00Z .. 2025-08-14 22:00Z.
DAY_START = datetime(2025, 8, 13, 22, 0, tzinfo=UTC)


def materialized_since(world: World, marker: int) -> dict[tuple[str, str], set[str]]:
    """(rollup, lane) -> partition keys materialized after event `marker`; the lane from the
    materialization's trigger (a run can carry both lanes up the chain)."""
    forward = {Trigger.FORWARD.value, Trigger.OPEN_BUCKET.value}
    out: dict[tuple[str, str], set[str]] = defaultdict(set)
    for name in world.catalog.rollups:
        records = world.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(name), after_storage_id=marker),
            limit=10_000,
        ).records
        for r in records:
            mat = r.asset_materialization
            assert mat is not None
            trigger = mat.metadata["trigger"].value
            out[(name, "forward" if trigger in forward else "recompute")].add(r.partition_key)
    return out


def correction() -> pa.Table:
    """The meter's readings for that local day, replaced by doubled values."""
    batch = pa.concat_tables(
        [day_batch(d, 4, seed=5) for d in (date(2025, 8, 13), date(2025, 8, 14))]
    )
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(DAY_START, ts.type)),
            pc.less(ts, pa.scalar(DAY_START + timedelta(days=1), ts.type)),
        ),
    )
    day = batch.filter(keep)
    return day.set_column(2, "energy_kwh", pc.multiply(day["energy_kwh"], 2.0))


def test_correction_three_months_back_recomputes_exactly_what_it_affects(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(
        pa.concat_tables([day_batch(d, 4, seed=5) for d in days(FIRST, DAYS)]), source="Import"
    )
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []

    marker = world.instance.event_log_storage.get_maximum_record_id() or 0
    corrected_at = datetime.now(UTC)
    world.ingest(correction(), source="Manual")
    world.tick(NOW)

    seen = materialized_since(world, marker)
    assert seen[("energy_hourly", "recompute")] == {f"2025-08-14-{h:02d}:00" for h in range(24)}
    assert seen[("energy_daily", "recompute")] == {"2025-08-14"}
    assert seen[("energy_weekly", "recompute")] == {"2025-08-11"}
    assert seen[("energy_monthly", "recompute")] == {"2025-08-01"}
    assert ("energy_yearly", "recompute") not in seen
    # 2025 is the open year: the forward lane refreshed it, and only open buckets went that way.
    assert "2025" in seen[("energy_yearly", "forward")]
    for name in world.catalog.rollups:
        open_key = buckets_in(world.catalog.rollup(name), [Window(NOW, NOW + timedelta(seconds=1))])
        assert len(seen.get((name, "forward"), set())) <= len(open_key)

    for name in ["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly"]:
        recomputes = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= corrected_at
            and j.trigger in (Trigger.PERIODIC, Trigger.CHAIN)
            and j.state is JobState.COMPLETED
            and j.windows_processed
        ]
        assert recomputes and all(j.entities == frozenset({METER}) for j in recomputes), name

    assert compare_all(world.query, world.raw(), world.catalog) == []
    again = world.tick(NOW)
    assert sum(len(r.runs) for r in again) == 0
