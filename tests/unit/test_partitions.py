"""Bucket arithmetic (`Bucketing`) against Dagster's partitions for the same rollup.

Expected UTC windows around DST switches, ISO weeks, leap days and month/year ends are written
out by hand; everywhere else the two implementations must agree key by key.
"""

import itertools
from datetime import UTC, date, datetime, timedelta
from typing import Any

import dagster as dg
import pyarrow as pa
import pytest

from rollup_assets.model.bucketing import Bucketing, first_bucket_start, storage_partition
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window, iso_utc, merge_windows
from rollup_assets.orchestration.partitions import (
    key_of_window,
    key_range_for,
    partitions_def_for,
    window_of_key,
)
from rollup_assets.resources.schemas import part_values
from rollup_assets.settings import DEFAULT_SPECS

SHIPPED = load_catalog(DEFAULT_SPECS).rollups
HOUR = timedelta(hours=1)
DAY = timedelta(days=1)


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def make_spec(
    alignment: str, zone: str, size: str | None = None, start: str = "2024-01-01"
) -> RollupSpec:
    body: dict[str, Any] = {
        "source": "r",
        "alignment": alignment,
        "reference_time_zone": zone,
        "start": start,
        "aggregations": [{"column": "x", "function": "Sum"}],
    }
    if size:
        body["size"] = size
    doc = {"raw_archives": {"r": {"columns": {"x": "double"}}}, "rollups": {"k": body}}
    return parse_catalog(doc).rollups["k"]


def keys_between(spec: RollupSpec, first: str, last: str) -> list[str]:
    pdef = partitions_def_for(spec)
    return pdef.get_partition_keys_in_range(dg.PartitionKeyRange(first, last))


def windows_of(spec: RollupSpec, keys: list[str]) -> list[Window]:
    pdef = partitions_def_for(spec)
    return [window_of_key(pdef, k) for k in keys]


def assert_agrees(spec: RollupSpec, keys: list[str]) -> list[Window]:
    """Dagster's window of every key is Bucketing's window, and the key maps back."""
    pdef = partitions_def_for(spec)
    b = Bucketing.of(spec)
    windows = windows_of(spec, keys)
    for key, w in zip(keys, windows, strict=True):
        assert b.window_of(w.start) == w, key
        assert b.window_of(w.end - timedelta(microseconds=1)) == w, key
        assert b.is_boundary(w.start) and b.next_start(w.start) == w.end, key
        assert key_of_window(pdef, w.start) == key
    for a, nxt in itertools.pairwise(windows):
        assert a.end == nxt.start  # contiguous, no gap, no overlap
    assert list(b.windows(windows[0].start, windows[-1].end)) == windows
    return windows


# ---------------------------------------------------------------------------------------------
# Vienna DST days, hourly


def test_spring_forward_day_has_23_hourly_partitions() -> None:
    spec = SHIPPED["energy_hourly"]
    keys = keys_between(spec, "2025-03-30-00:00", "2025-03-30-23:00")
    assert len(keys) == 23
    assert "2025-03-30-02:00" not in keys  # the skipped local hour has no key
    windows = assert_agrees(spec, keys)
    assert windows[0] == Window(utc(2025, 3, 29, 23), utc(2025, 3, 30, 0))
    assert keys[2] == "2025-03-30-03:00"
    assert windows[2] == Window(utc(2025, 3, 30, 1), utc(2025, 3, 30, 2))
    assert windows[-1].end == utc(2025, 3, 30, 22)
    assert all(w.end - w.start == HOUR for w in windows)


def test_fall_back_day_has_25_hourly_partitions_with_the_repeated_hour() -> None:
    spec = SHIPPED["energy_hourly"]
    keys = keys_between(spec, "2025-10-26-00:00", "2025-10-26-23:00")
    assert len(keys) == 25
    assert keys[2:4] == ["2025-10-26-02:00", "2025-10-26-02:00+0100"]
    windows = assert_agrees(spec, keys)
    pdef = partitions_def_for(spec)
    assert window_of_key(pdef, "2025-10-26-02:00") == Window(
        utc(2025, 10, 26, 0), utc(2025, 10, 26, 1)
    )
    assert window_of_key(pdef, "2025-10-26-02:00+0100") == Window(
        utc(2025, 10, 26, 1), utc(2025, 10, 26, 2)
    )
    assert key_of_window(pdef, utc(2025, 10, 26, 1, 30)) == "2025-10-26-02:00+0100"
    assert windows[0].start == utc(2025, 10, 25, 22) and windows[-1].end == utc(2025, 10, 26, 23)


@pytest.mark.parametrize(
    ("day", "hours", "start"),
    [
        ("2025-03-29", 24, utc(2025, 3, 28, 23)),
        ("2025-03-30", 23, utc(2025, 3, 29, 23)),
        ("2025-03-31", 24, utc(2025, 3, 30, 22)),
        ("2025-10-26", 25, utc(2025, 10, 25, 22)),
        ("2025-10-27", 24, utc(2025, 10, 26, 23)),
    ],
)
def test_daily_partitions_follow_local_days(day: str, hours: int, start: datetime) -> None:
    spec = SHIPPED["energy_daily"]
    (w,) = assert_agrees(spec, [day])
    assert w == Window(start, start + hours * HOUR)
    # The hourly partitions of that day tile the daily window exactly.
    hourly = Bucketing.of(SHIPPED["energy_hourly"])
    assert list(hourly.windows(w.start, w.end))[-1].end == w.end
    assert len(list(hourly.windows(w.start, w.end))) == hours


def test_quarter_hours_across_both_switches() -> None:
    spec = make_spec("FixedSize", "Europe/Vienna", "15m")
    spring = keys_between(spec, "2025-03-30-01:45", "2025-03-30-03:15")
    assert spring == ["2025-03-30-01:45", "2025-03-30-03:00", "2025-03-30-03:15"]
    assert_agrees(spec, spring)
    fall = keys_between(spec, "2025-10-26-02:45", "2025-10-26-03:00")
    repeated = [f"2025-10-26-02:{m:02d}+0100" for m in (0, 15, 30, 45)]
    assert fall == ["2025-10-26-02:45", *repeated, "2025-10-26-03:00"]
    windows = assert_agrees(spec, fall)
    assert windows[1].start == utc(2025, 10, 26, 1)


# ---------------------------------------------------------------------------------------------
# Weeks, leap days, month and year ends


def test_iso_week_2025_w01_starts_on_2024_12_30_local() -> None:
    spec = SHIPPED["energy_weekly"]
    assert date.fromisocalendar(2025, 1, 1) == date(2024, 12, 30)
    (w,) = assert_agrees(spec, ["2024-12-30"])
    assert w == Window(utc(2024, 12, 29, 23), utc(2025, 1, 5, 23))
    b = Bucketing.of(spec)
    assert b.floor(utc(2025, 1, 1, 12)) == w.start  # New Year's Day belongs to 2025-W01
    assert b.floor(utc(2024, 12, 29, 22, 59)) == utc(2024, 12, 22, 23)  # Sunday: 2024-W52
    assert key_of_window(partitions_def_for(spec), utc(2024, 12, 31)) == "2024-12-30"


def test_weeks_spanning_dst_switches_are_167_and_169_hours() -> None:
    spec = SHIPPED["energy_weekly"]
    spring, fall = assert_agrees(spec, ["2025-03-24"]), assert_agrees(spec, ["2025-10-20"])
    assert spring[0].end - spring[0].start == 167 * HOUR
    assert fall[0].end - fall[0].start == 169 * HOUR
    keys = keys_between(spec, "2024-12-23", "2025-12-29")
    assert len(keys) == 54 and all(date.fromisoformat(k).weekday() == 0 for k in keys)
    assert_agrees(spec, keys)


def test_leap_day() -> None:
    daily, monthly, yearly = (
        SHIPPED[n] for n in ("energy_daily", "energy_monthly", "energy_yearly")
    )
    assert keys_between(daily, "2024-02-28", "2024-03-01") == [
        "2024-02-28",
        "2024-02-29",
        "2024-03-01",
    ]
    (leap,) = assert_agrees(daily, ["2024-02-29"])
    assert leap == Window(utc(2024, 2, 28, 23), utc(2024, 2, 29, 23))
    (feb,) = assert_agrees(monthly, ["2024-02-01"])
    assert feb == Window(utc(2024, 1, 31, 23), utc(2024, 2, 29, 23))
    assert feb.end - feb.start == 29 * DAY
    (feb25,) = assert_agrees(monthly, ["2025-02-01"])
    assert feb25.end - feb25.start == 28 * DAY
    (y2024,) = assert_agrees(yearly, ["2024"])
    assert y2024.end - y2024.start == 366 * DAY
    assert Bucketing.of(monthly).floor(utc(2024, 2, 29, 22, 59, 59)) == feb.start


def test_month_ends() -> None:
    spec = SHIPPED["energy_monthly"]
    keys = keys_between(spec, "2024-01-01", "2025-12-01")
    assert len(keys) == 24
    windows = assert_agrees(spec, keys)
    # Local month lengths in hours: March loses an hour, October gains one.
    hours = [round((w.end - w.start) / HOUR) for w in windows[:12]]
    assert hours == [744, 696, 743, 720, 744, 720, 744, 744, 720, 745, 720, 744]
    b = Bucketing.of(spec)
    assert b.floor(utc(2024, 1, 31, 22, 59, 59, 999999)) == utc(2023, 12, 31, 23)
    assert b.floor(utc(2024, 1, 31, 23)) == utc(2024, 1, 31, 23)  # local Feb 1st, 00:00
    assert b.next_start(utc(2024, 11, 30, 23)) == utc(2024, 12, 31, 23)  # December -> January
    assert b.prev_start(utc(2024, 1, 31, 23)) == utc(2023, 12, 31, 23)


def test_year_ends() -> None:
    spec = SHIPPED["energy_yearly"]
    windows = assert_agrees(spec, keys_between(spec, "2024", "2027"))
    assert [w.start for w in windows] == [utc(y - 1, 12, 31, 23) for y in (2024, 2025, 2026, 2027)]
    b = Bucketing.of(spec)
    assert b.floor(utc(2024, 12, 31, 22, 59)) == utc(2023, 12, 31, 23)
    assert b.floor(utc(2024, 12, 31, 23)) == utc(2024, 12, 31, 23)
    assert key_of_window(partitions_def_for(spec), utc(2024, 12, 31, 23, 30)) == "2025"


# ---------------------------------------------------------------------------------------------
# Agreement over longer spans and other zones


@pytest.mark.parametrize(
    ("spec", "first", "last"),
    [
        pytest.param(SHIPPED["energy_hourly"], "2024-03-30-00:00", "2024-04-01-00:00", id="h"),
        pytest.param(SHIPPED["energy_daily"], "2024-01-01", "2026-01-01", id="day"),
        pytest.param(SHIPPED["energy_weekly"], "2024-01-01", "2026-12-28", id="week"),
        pytest.param(SHIPPED["energy_monthly"], "2024-01-01", "2030-12-01", id="month"),
        pytest.param(SHIPPED["energy_yearly"], "2024", "2040", id="year"),
        pytest.param(
            make_spec("FixedSize", "UTC", "2h"), "2025-10-25-00:00", "2025-10-27-22:00", id="2h"
        ),
        pytest.param(
            make_spec("FixedSize", "Asia/Kolkata", "30m"),
            "2025-01-01-00:00",
            "2025-01-02-00:00",
            id="30m-kolkata",
        ),
        pytest.param(
            make_spec("CalendarDay", "America/Havana"), "2024-03-01", "2024-11-30", id="havana"
        ),
        pytest.param(
            make_spec("CalendarDay", "America/Santiago"), "2024-03-01", "2024-10-01", id="santiago"
        ),
        pytest.param(
            make_spec("CalendarMonth", "Australia/Lord_Howe"), "2024-01-01", "2026-01-01", id="lhi"
        ),
    ],
)
def test_bucketing_agrees_with_dagster(spec: RollupSpec, first: str, last: str) -> None:
    assert len(assert_agrees(spec, keys_between(spec, first, last))) > 1


def test_midnight_skipped_by_dst_starts_the_day_at_one() -> None:
    """Havana springs forward at midnight: the day starts at 01:00 local, 05:00 UTC."""
    spec = make_spec("CalendarDay", "America/Havana")
    (w,) = assert_agrees(spec, ["2024-03-10"])
    assert w == Window(utc(2024, 3, 10, 5), utc(2024, 3, 11, 4))


def test_first_partition_is_the_first_bucket_at_or_after_start() -> None:
    spec = make_spec("FixedSize", "Europe/Vienna", "1h", start="2024-01-01T00:30:00")
    assert first_bucket_start(spec) == utc(2024, 1, 1, 0)  # local 01:00
    pdef = partitions_def_for(spec)
    assert pdef.get_first_partition_key() == "2024-01-01-01:00"
    shipped = partitions_def_for(SHIPPED["energy_daily"])
    assert window_of_key(shipped, shipped.get_first_partition_key()).start == utc(2023, 12, 31, 23)


@pytest.mark.parametrize(
    ("size", "start"), [("1h", "2025-10-26T02:30:00"), ("15m", "2025-10-26T02:50:00")]
)
def test_first_partition_in_the_repeated_hour_of_a_fall_back_day(size: str, start: str) -> None:
    """Local 02:30 is read as its first occurrence (00:30Z); the first bucket then starts at
    01:00Z, i.e. the second 02:00, and the first partition must be that bucket."""
    spec = make_spec("FixedSize", "Europe/Vienna", size, start=start)
    assert first_bucket_start(spec) == utc(2025, 10, 26, 1)
    pdef = partitions_def_for(spec)
    first = pdef.get_first_partition_key()
    assert first == "2025-10-26-02:00+0100"
    assert window_of_key(pdef, first).start == utc(2025, 10, 26, 1)


def test_the_open_bucket_is_the_last_key() -> None:
    pdef = partitions_def_for(SHIPPED["energy_hourly"])
    now = utc(2025, 3, 30, 10, 20)
    assert pdef.get_partition_keys(current_time=now)[-1] == "2025-03-30-12:00"  # local 12:20
    daily = partitions_def_for(SHIPPED["energy_daily"])
    assert daily.get_partition_keys(current_time=now)[-1] == "2025-03-30"


# ---------------------------------------------------------------------------------------------
# Window and merge_windows


def test_window_needs_aware_bounds() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        Window(datetime(2025, 1, 1), utc(2025, 1, 2))
    with pytest.raises(ValueError, match="timezone-aware"):
        Window(utc(2025, 1, 1), datetime(2025, 1, 2))


def test_windows_are_half_open() -> None:
    a = Window(utc(2025, 1, 1), utc(2025, 1, 2))
    assert not a.overlaps(Window(utc(2025, 1, 2), utc(2025, 1, 3)))  # touching only
    assert a.overlaps(Window(utc(2025, 1, 1, 23), utc(2025, 1, 3)))
    assert a.overlaps(Window(utc(2024, 12, 1), utc(2025, 2, 1)))  # containing
    assert str(a) == "[2025-01-01T00:00:00Z, 2025-01-02T00:00:00Z)"
    assert iso_utc(utc(2025, 1, 1, 0, 0, 0, 5)) == "2025-01-01T00:00:00.000005Z"


def _w(a: int, b: int) -> Window:
    base = utc(2025, 1, 1)
    return Window(base + a * HOUR, base + b * HOUR)


@pytest.mark.parametrize(
    ("windows", "merged"),
    [
        ([], []),
        ([_w(0, 1)], [_w(0, 1)]),
        ([_w(3, 4), _w(0, 1)], [_w(0, 1), _w(3, 4)]),  # sorted, disjoint kept
        ([_w(0, 2), _w(1, 3)], [_w(0, 3)]),  # overlapping
        ([_w(0, 1), _w(1, 2)], [_w(0, 2)]),  # adjacent
        ([_w(0, 10), _w(2, 3), _w(4, 5)], [_w(0, 10)]),  # contained
        ([_w(5, 6), _w(0, 2), _w(1, 3), _w(3, 4), _w(8, 9)], [_w(0, 4), _w(5, 6), _w(8, 9)]),
        ([_w(0, 1), _w(0, 1)], [_w(0, 1)]),
    ],
)
def test_merge_windows(windows: list[Window], merged: list[Window]) -> None:
    assert merge_windows(windows) == merged
    assert merge_windows(set(windows)) == merged


def _hours(windows: list[Window]) -> set[int]:
    base = utc(2025, 1, 1)
    return {h for w in windows for h in range((w.start - base) // HOUR, (w.end - base) // HOUR)}


def test_merge_windows_matches_an_hour_by_hour_union() -> None:
    windows = [_w(a, b) for a, b in [(0, 3), (2, 5), (7, 8), (8, 9), (11, 12), (4, 6), (20, 21)]]
    merged = merge_windows(windows)
    assert _hours(merged) == _hours(windows)
    assert all(a.end < b.start for a, b in itertools.pairwise(merged))
    assert merged == [_w(0, 6), _w(7, 9), _w(11, 12), _w(20, 21)]


def test_key_range_spans_the_hull_of_windows() -> None:
    spec = SHIPPED["energy_hourly"]
    pdef = partitions_def_for(spec)
    b = Bucketing.of(spec)
    windows = [b.window_of(utc(2025, 10, 26, 1, 10)), b.window_of(utc(2025, 10, 25, 23, 5))]
    assert key_range_for(pdef, windows) == dg.PartitionKeyRange(
        "2025-10-26-01:00", "2025-10-26-02:00+0100"
    )


def test_bucketing_windows_cover_a_span() -> None:
    b = Bucketing.of(SHIPPED["energy_daily"])
    spans = list(b.windows(utc(2025, 3, 29, 12), utc(2025, 3, 31, 0)))
    assert [w.start for w in spans] == [
        utc(2025, 3, 28, 23),
        utc(2025, 3, 29, 23),
        utc(2025, 3, 30, 22),
    ]
    assert b.ceil(utc(2025, 3, 29, 12)) == utc(2025, 3, 29, 23)
    assert b.ceil(utc(2025, 3, 29, 23)) == utc(2025, 3, 29, 23)
    assert not b.is_boundary(utc(2025, 3, 30, 23))


@pytest.mark.parametrize("spec", SHIPPED.values(), ids=lambda s: s.name)
def test_storage_partition_names_and_windows_agree(spec: RollupSpec) -> None:
    """The partition a file lands in (`schemas.part_values`, a name) and the window folding and
    the surface reason with (`bucketing.storage_partition`) are the same partition."""
    starts = [
        w.start
        for w in Bucketing.of(spec).windows(
            datetime(2024, 12, 20, tzinfo=UTC), datetime(2026, 1, 10, tzinfo=UTC)
        )
    ]
    names = part_values(spec, pa.array(starts, pa.timestamp("us", tz="UTC"))).to_pylist()
    for start, name in zip(starts, names, strict=True):
        window = storage_partition(spec, start)
        assert window.start <= start < window.end
        assert window.start.strftime("%Y-%m-%d")[: len(name)] == name, (start, name)
