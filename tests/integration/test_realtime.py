"""Real-time reads with a pinned clock: the buckets the forward lane has not closed (the open one,
refreshed before newer rows arrived, and ones that ended but are not closed yet) are aggregated
from the source at every level, and equal the pandas oracle of the raw rows."""

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import UTC, date, datetime, timedelta
from functools import partial
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.services import realtime
from rollup_assets.services.downsample import downsample_arrow
from rollup_assets.services.realtime import realtime_arrow
from tests.conftest import World, world_of
from tests.integration.test_time_range_oracle import ARCHIVE, SPECS, quarter_hours, whole_hours
from tests.oracle import compare, compare_all, oracle

T0 = datetime(2025, 6, 10, 8, 30, tzinfo=UTC)
H = timedelta(hours=1)
METERS = ["m1", "m2"]


def readings(start: datetime, end: datetime, value: float = 1.0) -> pa.Table:
    rows, t = [], start
    while t < end:
        rows += [
            {
                "entity_id": m,
                "ts": t,
                "energy_kwh": value + i,
                "power_kw": 2.0 + i,
                "voltage_v": 230.0 - i,
            }
            for i, m in enumerate(METERS)
        ]
        t += timedelta(minutes=15)
    return pa.Table.from_pylist(rows)


class _Done:
    """An executor that runs what it is given at once (its futures are done when returned)."""

    def submit(self, fn: Callable[..., object], *args: object) -> Future:
        done: Future = Future()
        done.set_result(fn(*args))
        return done


def test_realtime_reads_equal_the_oracle_above_the_watermark(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    world.ops.activate("energy_raw", now=T0)
    world.activate_all(T0)
    # Nothing ingested yet: a real-time read of every level is empty, not an error.
    for name in world.catalog.rollups:
        assert realtime_arrow(world.engine, name).num_rows == 0

    world.ingest(readings(T0 - 1.5 * H, T0 + timedelta(minutes=15)))  # from 07:00
    world.tick(T0)  # closes 07:00-08:00; refreshes the open bucket 08:00-09:00
    mark = world.engine.states.get("energy_hourly").watermark
    assert mark == datetime(2025, 6, 10, 8, tzinfo=UTC)

    # Later rows: the rest of the open bucket (its stored refresh is now stale) and two more
    # hours, one of them ended by the clock but not closed (no tick since).
    world.ingest(readings(T0 + timedelta(minutes=15), T0 + 2.5 * H, value=10.0))
    raw = world.raw()
    assert world.engine.states.get("energy_hourly").watermark == mark

    plain = world.query("energy_hourly")
    assert datetime(2025, 6, 10, 9, tzinfo=UTC) not in plain["bucket_start"].to_pylist()

    live = realtime_arrow(world.engine, "energy_hourly")
    hourly = world.catalog.rollup("energy_hourly")
    assert compare(live, oracle(raw, hourly), hourly) == []
    assert sorted(set(live["bucket_start"].to_pylist()))[-1] == datetime(
        2025, 6, 10, 10, tzinfo=UTC
    )
    # Every level above reads the level below in real time too.
    assert compare_all(lambda name: realtime_arrow(world.engine, name), raw, world.catalog) == []
    # The stored buckets of every entity came from the current surface; resolving the pointers
    # instead gives the same rows.
    surfaced = {n: realtime_arrow(world.engine, n) for n in world.catalog.rollups}
    taken: list[tuple[str, bool]] = []
    real = realtime.rows_now

    def spied(engine, spec, *args):  # type: ignore[no-untyped-def]
        rows = real(engine, spec, *args)
        taken.append((spec.name, rows is not None))
        return rows

    monkeypatch.setattr(realtime, "rows_now", spied)
    assert realtime_arrow(world.engine, "energy_hourly").equals(surfaced["energy_hourly"])
    assert taken == [("energy_hourly", True)]
    monkeypatch.setattr(realtime, "rows_now", lambda *a: None)
    for name, rows in surfaced.items():
        assert realtime_arrow(world.engine, name).equals(rows), name
    # The live part, started ahead of a stored read that finds no current surface, is cancelled
    # when it has not started yet and waited for when it has: the same rows either way.
    blocked, busy = threading.Event(), ThreadPoolExecutor(max_workers=1)
    busy.submit(blocked.wait)  # its only worker is taken: the live part waits in the queue
    try:
        monkeypatch.setattr(realtime, "_LIVE", busy)
        assert realtime_arrow(world.engine, "energy_hourly").equals(surfaced["energy_hourly"])
    finally:
        blocked.set()
        busy.shutdown()
    monkeypatch.setattr(realtime, "_LIVE", _Done())
    assert realtime_arrow(world.engine, "energy_hourly").equals(surfaced["energy_hourly"])

    # A time range and an entity filter reach across the watermark.
    part = realtime_arrow(world.engine, "energy_hourly", mark - H, mark + 2 * H, entities=["m2"])
    want = oracle(raw[raw["entity_id"] == "m2"], hourly)
    want = want[(want["bucket_start"] >= mark - H) & (want["bucket_start"] < mark + 2 * H)]
    assert len(want) == 3 and compare(part, want, hourly) == []

    # Downsampled in real time: the local day holding every reading, over all meters.
    day = downsample_arrow(world.engine, "energy_hourly", "day", group_by="all", realtime=True)
    assert day.num_rows == 1
    assert day["energy_kwh_count"][0].as_py() == len(raw)
    assert day["energy_kwh_sum"][0].as_py() == raw["energy_kwh"].sum()


def test_frozen_buckets_show_what_is_stored(world: World) -> None:
    world.ops.activate("energy_raw", now=T0)
    world.ingest(readings(T0 - 1.5 * H, T0 + timedelta(minutes=15)))
    world.activate_all(T0)
    world.tick(T0)
    stored_open = world.query("energy_hourly", start=T0 - timedelta(minutes=30))
    world.ops.freeze("energy_hourly", T0 + 0.5 * H)  # the open bucket 08:00-09:00 is frozen
    world.ingest(readings(T0 + timedelta(minutes=15), T0 + 1.5 * H, value=10.0))

    live = realtime_arrow(world.engine, "energy_hourly", start=T0 - timedelta(minutes=30))
    frozen = live.filter(pc.less(live["bucket_start"], T0 + 0.5 * H))
    assert frozen.to_pylist() == stored_open.to_pylist()
    after = live.filter(pc.greater_equal(live["bucket_start"], T0 + 0.5 * H))
    assert after["energy_kwh_count"].to_pylist() == [4, 4]  # 09:00 to 09:45, per meter


def test_realtime_reads_over_a_time_range_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark
) -> None:
    """Nothing closed yet: every level of a chain over `[range_start, range_end)` rows is read
    from the rows (by `range_start`), through every level below, and equals the oracle."""
    catalog = parse_catalog(SPECS, origin="time-range test")
    for world in world_of(tmp_path, monkeypatch, catalog):
        world.activate_all(T0)
        day = date(2025, 6, 10)
        rows = pa.concat_tables([quarter_hours(day), whole_hours(day)])
        since = pc.greater_equal(rows["range_start"], pa.scalar(T0 - 1.5 * H))
        world.ingest(rows.filter(since), archive=ARCHIVE)
        raw = world.raw(ARCHIVE)
        assert len(raw) and all(world.query(name).num_rows == 0 for name in catalog.rollups)
        assert compare_all(partial(realtime_arrow, world.engine), raw, catalog) == []
