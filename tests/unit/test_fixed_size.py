"""FixedSize buckets of any whole number of minutes from an origin: the bucket arithmetic, the
storage partition of long buckets, and the Dagster partitions a bucket is made of.

Expected UTC windows are written out by hand (days since the epoch counted by hand too), so the
bucket code is checked against arithmetic, not against itself; Dagster's windows are checked
against the buckets key by key.
"""

import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

from rollup_assets.model.bucketing import (
    Bucketing,
    StorageUnit,
    first_bucket_start,
    storage_partition,
    storage_unit,
)
from rollup_assets.model.grid import partition_starts, partitions_per_bucket
from rollup_assets.model.jobs import Lane, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import (
    cron_for,
    key_of_window,
    key_range_for,
    keys_of_bucket,
    partitions_def_for,
    window_of_key,
)
from rollup_assets.orchestration.tags import RANGE_END, RANGE_START
from rollup_assets.resources.schemas import part_values
from rollup_assets.sensors.definitions import run_request_for
from rollup_assets.sensors.drain import Launch
from rollup_assets.settings import DEFAULT_SPECS

MINUTE = timedelta(minutes=1)
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)
VIENNA = "Europe/Vienna"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def fixed(
    size: str, zone: str = VIENNA, origin: str | None = None, start: str = "2024-01-01"
) -> RollupSpec:
    body: dict[str, Any] = {
        "source": "r",
        "alignment": "FixedSize",
        "size": size,
        "reference_time_zone": zone,
        "start": start,
        "aggregations": [{"column": "x", "function": "Sum"}],
    }
    if origin is not None:
        body["origin"] = origin
    doc = {"raw_archives": {"r": {"columns": {"x": "double"}}}, "rollups": {"k": body}}
    return parse_catalog(doc).rollups["k"]


# ---------------------------------------------------------------------------------------------
# Bucket arithmetic from the origin


def test_90_minute_buckets_ignore_the_vienna_dst_switches() -> None:
    """Every 90-minute bucket lasts 90 minutes of UTC time from the epoch, through the spring
    and autumn switches alike (the local day has 23 or 25 hours; the buckets do not care)."""
    b = Bucketing.of(fixed("90m"))
    # 2025-03-30 00:00Z is 20177 days = 322,832 buckets of 90 minutes after the epoch.
    spring = list(b.windows(utc(2025, 3, 30, 0), utc(2025, 3, 30, 4)))
    assert [w.start for w in spring] == [
        utc(2025, 3, 30, 0),
        utc(2025, 3, 30, 1, 30),  # local 02:30 does not exist; 03:30 CEST does
        utc(2025, 3, 30, 3),
    ]
    assert all(w.end - w.start == 90 * MINUTE for w in spring)
    # The repeated local hour of 2025-10-26 (01:00-02:00Z) lies inside one bucket.
    assert b.window_of(utc(2025, 10, 26, 1, 15)) == Window(
        utc(2025, 10, 26, 0, 0), utc(2025, 10, 26, 1, 30)
    )
    assert b.floor(utc(2025, 10, 26, 1, 30)) == utc(2025, 10, 26, 1, 30)
    assert b.is_boundary(utc(2025, 10, 26, 4, 30)) and not b.is_boundary(utc(2025, 10, 26, 4))


@pytest.mark.parametrize(
    ("t", "start"),
    [
        (
            utc(2025, 1, 1, 12),
            utc(2024, 12, 31),
        ),  # day 20089 is odd: its bucket began the day before
        (utc(2025, 1, 2), utc(2025, 1, 2)),
        (utc(2025, 3, 30, 12), utc(2025, 3, 29)),  # day 20177, the Vienna spring switch
        (utc(2025, 10, 26, 1, 30), utc(2025, 10, 25)),  # day 20387, the autumn switch
        (utc(1969, 12, 31, 23, 59), utc(1969, 12, 30)),  # before the epoch
    ],
)
def test_two_day_buckets_count_from_the_epoch(t: datetime, start: datetime) -> None:
    b = Bucketing.of(fixed("2d"))
    assert b.window_of(t) == Window(start, start + 2 * DAY)
    assert b.next_start(start) == start + 2 * DAY and b.prev_start(start) == start - 2 * DAY


@pytest.mark.parametrize(
    ("t", "start"),
    [
        (utc(2024, 1, 1, 0, 30), utc(2024, 1, 1, 0, 30)),  # the origin is a boundary
        (utc(2024, 1, 1, 0, 29), utc(2023, 12, 31, 23)),  # just before it
        (utc(2024, 1, 1, 2), utc(2024, 1, 1, 2)),
        (utc(1970, 1, 1, 0, 10), utc(1969, 12, 31, 23)),  # long before it, across the epoch
        (utc(2030, 6, 1, 12, 34, 56, 7), utc(2030, 6, 1, 12, 30)),
    ],
)
def test_buckets_count_from_a_declared_origin(t: datetime, start: datetime) -> None:
    b = Bucketing.of(fixed("90m", origin="2024-01-01T00:30:00Z"))
    assert b.floor(t) == start
    assert b.ceil(t) == (start if start == t else start + 90 * MINUTE)


def test_an_origin_far_from_the_data_only_sets_the_phase() -> None:
    near = Bucketing.of(fixed("7d", origin="2024-01-01T00:00:00Z"))  # a Monday
    far = Bucketing.of(fixed("7d", origin="2124-01-03T00:00:00Z"))  # 5,218 weeks later
    t = utc(2025, 10, 26, 1, 30)
    assert near.window_of(t) == far.window_of(t) == Window(utc(2025, 10, 20), utc(2025, 10, 27))


def test_first_bucket_is_the_first_at_or_after_the_local_start() -> None:
    """start 2024-01-01 is local midnight in Vienna, 2023-12-31 23:00Z; 2-day buckets from the
    epoch start on even days: 2023-12-31 is day 19722. 90 minutes before a 00:30 origin is
    23:00 the day before: a boundary too."""
    assert first_bucket_start(fixed("2d")) == utc(2024, 1, 2)
    half_past = fixed("90m", origin="2024-01-01T00:30:00Z")
    assert first_bucket_start(half_past) == utc(2023, 12, 31, 23)


def test_boundaries_near_days_of_long_buckets() -> None:
    b = Bucketing.of(fixed("7d"))  # weeks from Thursday 1970-01-01
    near = b.boundaries_near([utc(2025, 10, 26).date()])
    assert near == [utc(2025, 10, 23), utc(2025, 10, 30)]


# ---------------------------------------------------------------------------------------------
# Storage partitions: a bucket lies in the partition of its start


@pytest.mark.parametrize(
    ("size", "unit"),
    [
        ("15m", StorageUnit.DAY),
        ("1d", StorageUnit.DAY),
        ("25h", StorageUnit.MONTH),
        ("2d", StorageUnit.MONTH),
        ("6d", StorageUnit.MONTH),
        ("7d", StorageUnit.YEAR),
    ],
)
def test_storage_unit_grows_with_the_bucket(size: str, unit: StorageUnit) -> None:
    assert storage_unit(fixed(size, zone="UTC")) is unit


@pytest.mark.parametrize(("size", "zone"), [("2d", VIENNA), ("7d", VIENNA), ("90m", VIENNA)])
def test_a_long_bucket_lies_in_the_storage_partition_of_its_start(size: str, zone: str) -> None:
    spec = fixed(size, zone=zone)
    buckets = list(Bucketing.of(spec).windows(utc(2024, 12, 20), utc(2026, 1, 10)))
    names = part_values(spec, pa.array([w.start for w in buckets], pa.timestamp("us", tz="UTC")))
    straddling = 0
    for w, name in zip(buckets, names.to_pylist(), strict=True):
        part = storage_partition(spec, w.start)
        assert part.start <= w.start < part.end
        assert part.start.strftime("%Y-%m-%d")[: len(name)] == name
        straddling += w.end > part.end
    if size != "90m":
        assert straddling > 0  # some buckets end in the next partition, and still have one


def test_a_two_day_bucket_over_a_month_end_is_in_its_start_month() -> None:
    spec = fixed("2d")
    w = Bucketing.of(spec).window_of(utc(2025, 4, 1, 12))
    assert w == Window(utc(2025, 3, 31), utc(2025, 4, 2))  # 2025-03-31 is day 20178, even
    assert storage_partition(spec, w.start) == Window(utc(2025, 3, 1), utc(2025, 4, 1))
    assert part_values(spec, pa.array([w.start], pa.timestamp("us", tz="UTC"))).to_pylist() == [
        "2025-03"
    ]


# ---------------------------------------------------------------------------------------------
# Dagster partitions: a bucket is one partition or a whole number of them


def assert_tiles(spec: RollupSpec, first: datetime, last: datetime) -> list[Window]:
    """Every bucket in [first, last) is made of whole Dagster partitions, each partition lies
    in exactly one bucket, and the keys of a bucket map back to it."""
    pdef = partitions_def_for(spec)
    b = Bucketing.of(spec)
    n = partitions_per_bucket(spec)
    buckets = list(b.windows(first, last))
    for bucket in buckets:
        keys = keys_of_bucket(spec, pdef, bucket)
        assert len(keys) == n == len(set(keys))
        parts = [window_of_key(pdef, k) for k in keys]
        assert parts[0].start == bucket.start and parts[-1].end == bucket.end
        for a, nxt in itertools.pairwise(parts):
            assert a.end == nxt.start
        for part in parts:
            assert b.window_of(part.start) == bucket == b.window_of(part.end - timedelta(0, 0, 1))
            assert buckets_in(spec, [part]) == [bucket]  # one partition asks for its bucket
        rng = key_range_for(pdef, [bucket])
        assert pdef.get_partition_keys_in_range(rng) == keys
    all_keys = pdef.get_partition_keys_in_range(key_range_for(pdef, buckets))
    assert len(all_keys) == n * len(buckets)
    return buckets


@pytest.mark.parametrize(
    ("spec", "per_bucket", "cron"),
    [
        pytest.param(fixed("90m"), 3, "*/30 * * * *", id="90m"),
        pytest.param(fixed("90m", origin="2024-01-01T00:15:00Z"), 3, "15,45 * * * *", id="90m-15"),
        pytest.param(fixed("2d"), 48, "0 * * * *", id="2d-vienna"),
        pytest.param(fixed("7d", origin="2024-01-01T00:30:00Z"), 168, "30 * * * *", id="7d-30"),
        pytest.param(fixed("5h"), 5, "0 * * * *", id="5h"),
        pytest.param(fixed("2d", zone="UTC"), 2, "0 */24 * * *", id="2d-utc"),
        pytest.param(
            fixed("12h", zone="UTC", origin="2024-01-01T05:30:00Z"),
            1,
            "30 5,17 * * *",
            id="12h-utc-from-0530",
        ),
        pytest.param(
            fixed("2d", zone="Asia/Kolkata", origin="2024-01-01T00:00:00+05:30"),
            2,
            "0 */24 * * *",  # local midnights
            id="2d-kolkata",
        ),
        pytest.param(fixed("1h", zone="Asia/Kolkata"), 1, "30 * * * *", id="1h-kolkata"),
        pytest.param(fixed("3h", zone="America/New_York"), 3, "0 * * * *", id="3h-new-york"),
    ],
)
def test_buckets_are_whole_partitions_across_dst(
    spec: RollupSpec, per_bucket: int, cron: str
) -> None:
    assert (partitions_per_bucket(spec), cron_for(spec)) == (per_bucket, cron)
    assert spec.size is not None
    span = max(5 * DAY, 2 * spec.size)  # two buckets at least
    for first in [
        utc(2025, 3, 27),  # the Vienna spring switch
        utc(2025, 10, 23),  # the Vienna autumn switch
        utc(2025, 10, 30),  # the New York autumn switch
    ]:
        assert len(assert_tiles(spec, first, first + span)) > 1


def test_a_90_minute_bucket_over_the_repeated_hour_is_three_half_hour_partitions() -> None:
    spec = fixed("90m")
    pdef = partitions_def_for(spec)
    bucket = Window(utc(2025, 10, 26, 0), utc(2025, 10, 26, 1, 30))
    assert keys_of_bucket(spec, pdef, bucket) == [
        "2025-10-26-02:00",
        "2025-10-26-02:30",
        "2025-10-26-02:00+0100",
    ]
    assert key_range_for(pdef, [bucket]) == dg.PartitionKeyRange(
        "2025-10-26-02:00", "2025-10-26-02:00+0100"
    )
    starts = [utc(2025, 10, 26, 0), utc(2025, 10, 26, 0, 30), utc(2025, 10, 26, 1)]
    assert partition_starts(spec, bucket) == starts


def test_every_partition_of_the_open_bucket_exists() -> None:
    """`end_offset` is one bucket of partitions: the open 2-day bucket's hours all exist (a
    run for the bucket names its last hour); so do some hours of the next bucket, which no lane
    writes before it opens."""
    spec = fixed("2d")
    pdef = partitions_def_for(spec)
    now = utc(2025, 10, 25, 3, 20)  # early in the bucket [2025-10-25, 2025-10-27)
    keys = pdef.get_partition_keys(current_time=now)
    bucket = Bucketing.of(spec).window_of(now)
    assert set(keys_of_bucket(spec, pdef, bucket)) <= set(keys)
    assert keys[-1] == key_of_window(pdef, utc(2025, 10, 27, 2))  # the 48th hour after now's
    one = partitions_def_for(fixed("1h"))  # one partition per bucket: end_offset 1, as before
    assert one.get_partition_keys(current_time=now)[-1] == "2025-10-25-05:00"


SHIPPED = load_catalog(DEFAULT_SPECS).rollups


@pytest.mark.parametrize(
    ("spec", "cron", "first_key"),
    [
        pytest.param(SHIPPED["energy_hourly"], "0 * * * *", "2024-01-01-00:00", id="shipped-h"),
        pytest.param(fixed("15m"), "*/15 * * * *", "2024-01-01-00:00", id="15m"),
        pytest.param(fixed("1m", zone="UTC"), "* * * * *", "2024-01-01-00:00", id="1m"),
        pytest.param(fixed("2h", zone="UTC"), "0 */2 * * *", "2024-01-01-00:00", id="2h"),
        pytest.param(fixed("1d", zone="UTC"), "0 */24 * * *", "2024-01-01-00:00", id="1d"),
        pytest.param(fixed("30m", zone="Asia/Kolkata"), "*/30 * * * *", "2024-01-01-00:00"),
    ],
)
def test_rollups_valid_before_origins_keep_their_partitions(
    spec: RollupSpec, cron: str, first_key: str
) -> None:
    """A bucket that was one partition stays one partition, under the same schedule and keys."""
    pdef = partitions_def_for(spec)
    assert (cron_for(spec), pdef.end_offset, pdef.get_first_partition_key()) == (cron, 1, first_key)
    assert partitions_per_bucket(spec) == 1


def test_a_run_request_asks_for_every_partition_of_its_buckets() -> None:
    """The sensors' request for a 2-day bucket names its first and last hour: 48 partitions,
    the repeated local hour of 2025-10-26 among them (a bucket from 2025-10-24 05:00Z)."""
    doc = {
        "raw_archives": {"r": {"columns": {"x": "double"}}},
        "rollups": {
            "k": {
                "source": "r",
                "alignment": "FixedSize",
                "size": "2d",
                "origin": "2025-01-01T05:00:00Z",
                "reference_time_zone": VIENNA,
                "start": "2025-01-01",
                "aggregations": [{"column": "x", "function": "Sum"}],
            }
        },
    }
    catalog = parse_catalog(doc)
    bucket = Window(utc(2025, 10, 24, 5), utc(2025, 10, 26, 5))
    request = run_request_for(catalog, Launch("k", Lane.RECOMPUTE, Trigger.PERIODIC, [bucket], "j"))
    start, end = request.tags[RANGE_START], request.tags[RANGE_END]
    assert (start, end) == ("2025-10-24-07:00", "2025-10-26-05:00")  # CEST, then CET
    keys = partitions_def_for(catalog.rollup("k")).get_partition_keys_in_range(
        dg.PartitionKeyRange(start, end)
    )
    assert len(keys) == 48 and "2025-10-26-02:00+0100" in keys
