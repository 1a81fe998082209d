"""The forward lane with a pinned clock: buckets close once, the open buckets (the current one and
an ended one inside the watermark lag) stay live, and a recompute never claims an open bucket.
The lane aggregates on the driver while its source files are small, and on Spark past that, to
the same values."""

import itertools
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.model.jobs import JobState, Trigger
from tests.conftest import ON_SPARK, World
from tests.oracle import compare, oracle

T0 = datetime(2025, 6, 10, 8, 30, tzinfo=UTC)
H = timedelta(hours=1)
METERS = ["m1", "m2"]


def readings(start: datetime, end: datetime, value: float = 1.0) -> pa.Table:
    rows, t = [], start
    while t < end:
        rows += [
            {"entity_id": m, "ts": t, "energy_kwh": value + i, "power_kw": 2.0}
            for i, m in enumerate(METERS)
        ]
        t += timedelta(minutes=15)
    return pa.Table.from_pylist(rows)


def hourly_forward_jobs(world: World) -> list:
    return [
        j
        for j in world.engine.ledger.history("energy_hourly", limit=1000)
        if j.trigger in (Trigger.FORWARD, Trigger.OPEN_BUCKET) and j.state is JobState.COMPLETED
    ]


@pytest.mark.parametrize("world", ["the driver", ON_SPARK], indirect=True)
def test_forward_lane_with_a_pinned_clock(world: World) -> None:
    where = "Spark" if world.engine.partials.driver_rows == 0 else "the driver"
    world.ops.activate("energy_raw", now=T0)
    world.ingest(readings(T0 - 3 * H, T0))
    world.activate_all(T0)
    assert world.engine.states.get("energy_hourly").watermark == datetime(
        2025, 6, 10, 7, 0, tzinfo=UTC
    )

    clock = T0
    world.tick(clock)  # closes 07:00-08:00, refreshes the open 08:00-09:00
    assert world.engine.states.get("energy_hourly").watermark == datetime(
        2025, 6, 10, 8, 0, tzinfo=UTC
    )

    # Nothing changed and nothing closed: the next tick has nothing to do for the hourly level.
    before = len(hourly_forward_jobs(world))
    world.tick(clock + timedelta(minutes=5))
    assert len(hourly_forward_jobs(world)) == before

    # New readings in the open bucket: the next tick refreshes it without moving the watermark.
    world.ingest(readings(T0, T0 + timedelta(minutes=20), value=10.0))
    world.tick(clock + timedelta(minutes=20))
    assert world.engine.states.get("energy_hourly").watermark == datetime(
        2025, 6, 10, 8, 0, tzinfo=UTC
    )
    open_rows = world.query("energy_hourly", start=datetime(2025, 6, 10, 8, tzinfo=UTC))
    # 08:00 and 08:15 arrived before, 08:30 and 08:45 now (values 10 and 11 per meter).
    assert sorted(open_rows["energy_kwh_count"].to_pylist()) == [4, 4]
    assert sorted(open_rows["energy_kwh_sum"].to_pylist()) == [
        2 * 1.0 + 2 * 10.0,
        2 * 2.0 + 2 * 11.0,
    ]

    # Walk the clock over two more hours, with data arriving as it would: each step closes the
    # bucket the step before refreshed as open (a third step would only repeat the second).
    for step in range(1, 3):
        world.ingest(
            readings(
                T0 + timedelta(minutes=20) + (step - 1) * H, T0 + timedelta(minutes=20) + step * H
            )
        )
        world.tick(T0 + step * H)
    assert world.engine.states.get("energy_hourly").watermark == datetime(
        2025, 6, 10, 10, 0, tzinfo=UTC
    )

    # Each closed bucket was closed by the forward lane exactly once: the watermark only ever
    # advanced, one closing run per advance, and the advances tile 07:00..10:00 without overlap.
    marks = [
        st.watermark
        for st in world.engine.states.history("energy_hourly")
        if st.watermark is not None
    ]
    advances = [(a, b) for a, b in itertools.pairwise(marks) if b != a]
    assert all(b > a for a, b in advances)
    hours_closed = sum(int((b - a) / H) for a, b in advances)
    assert hours_closed == 3 and advances[0][0] == datetime(2025, 6, 10, 7, 0, tzinfo=UTC)
    forward_closes = [j for j in hourly_forward_jobs(world) if j.trigger is Trigger.FORWARD]
    assert len(forward_closes) == len(advances)
    worked = [j for j in hourly_forward_jobs(world) if j.windows_processed]
    assert worked and all(f"aggregated on {where}:" in (j.plan or "") for j in worked), [
        j.plan for j in worked
    ]

    spec = world.catalog.rollup("energy_hourly")
    expected = oracle(world.raw(), spec)
    cut = world.engine.states.get("energy_hourly").watermark
    first = datetime(2025, 6, 10, 7, 0, tzinfo=UTC)  # history before activation needs a backfill
    actual = world.query(
        "energy_hourly", start=first, end=cut + H
    )  # closed buckets and the open one
    window = (expected["bucket_start"] >= first) & (expected["bucket_start"] < cut + H)
    assert compare(actual, expected[window], spec) == []


def test_a_recompute_never_claims_the_open_bucket(world: World) -> None:
    world.ops.activate("energy_raw", now=T0)
    world.ingest(readings(T0 - 3 * H, T0 + timedelta(minutes=15)))
    world.activate_all(T0)
    world.tick(T0)
    mark = world.engine.states.get("energy_hourly").watermark
    open_start = mark  # 08:00: the open bucket at T0

    only_open = world.ops.request_recompute("energy_hourly", open_start, open_start + H)
    world.tick(T0, sensors=("retroactive_write_sensor",))
    done = world.engine.ledger.job(only_open.job_id)
    assert done.state is JobState.COMPLETED and done.windows_processed == 0

    spanning = world.ops.request_recompute("energy_hourly", mark - H, open_start + H)
    reports = world.tick(T0, sensors=("retroactive_write_sensor",))
    hourly_runs = [
        r for rep in reports for r in rep.runs if r.tags.get("rollups/rollup") == "energy_hourly"
    ]
    assert len(hourly_runs) == 1
    assert hourly_runs[0].tags["dagster/asset_partition_range_start"] == "2025-06-10-09:00"
    assert hourly_runs[0].tags["dagster/asset_partition_range_end"] == "2025-06-10-09:00"
    job = world.engine.ledger.job(spanning.job_id)
    # Only the closed bucket was aggregated (both meters' cells, unchanged, so left as they are).
    assert job.state is JobState.COMPLETED
    assert (job.cells_changed, job.cells_skipped, job.windows_processed) == (0, 2, 0)
    gens = world.query("energy_hourly", start=open_start)
    assert pc.all(pc.greater(gens["energy_kwh_count"], 0)).as_py()
    pointers = world.engine.rollups.snapshot(world.catalog.rollup("energy_hourly")).pointers
    assert all(p < open_start for p in pointers["bucket_start"].to_pylist())


def test_a_bucket_inside_the_watermark_lag_stays_live_until_it_closes(world: World) -> None:
    # 09:02: the 08:00 bucket has ended but closes only at 09:05 (the 5-minute lag).
    now = datetime(2025, 6, 10, 9, 2, tzinfo=UTC)
    lagging = datetime(2025, 6, 10, 8, 0, tzinfo=UTC)
    world.ops.activate("energy_raw", now=now)
    world.ingest(readings(lagging, lagging + H))
    world.activate_all(now)
    assert world.engine.states.get("energy_hourly").watermark == lagging

    def live_levels_equal_the_raw_data() -> None:
        raw = world.raw()
        for name in ("energy_hourly", "energy_daily"):
            spec = world.catalog.rollup(name)
            assert compare(world.query(name), oracle(raw, spec), spec) == [], name

    world.tick(now)
    assert world.engine.states.get("energy_hourly").watermark == lagging  # not closed yet
    live_levels_equal_the_raw_data()

    # A reading arrives late inside the lag: the next tick refreshes the ended bucket.
    world.ingest(
        pa.Table.from_pylist(
            [{"entity_id": "m1", "ts": lagging + 55 * timedelta(minutes=1), "energy_kwh": 100.0}]
        )
    )
    world.tick(now + timedelta(minutes=1))
    assert world.engine.states.get("energy_hourly").watermark == lagging
    live_levels_equal_the_raw_data()

    # Past the lag the bucket closes: the watermark moves on and nothing changes for readers.
    world.tick(now + timedelta(minutes=4))
    assert world.engine.states.get("energy_hourly").watermark == lagging + H
    live_levels_equal_the_raw_data()
