"""Downsampling queries over raw and time-range archives on the driver (Arrow, no Spark), against
an independent pandas oracle (`tests.query_oracle`), on one warehouse for the module
(`tests.raw_query_data`: Vienna DST days and the year end, nulls and NaNs, a time-range archive).
"""

import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest

from rollup_assets.model.errors import (
    ArchiveNotActivatedError,
    InvalidAggregationError,
    InvalidArchiveOperationError,
    InvalidStepError,
    InvalidTimeRangeError,
    InvalidTimeZoneError,
)
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services import downsample as downsampling
from rollup_assets.services.downsample import downsample, downsample_arrow
from rollup_assets.services.engine import Engine
from tests.query_oracle import actual_steps, differences, expected_steps
from tests.raw_query_data import (
    METERS,
    NAN_HOUR,
    NAN_METER,
    NULL_HOUR,
    NULL_METER,
    RANGE_AGGS,
    RAW_AGGS,
    VIENNA,
    build_engine,
    catalog,
    rows_of,
    specs,
)


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return build_engine(tmp_path_factory.mktemp("raw_queries"))


@pytest.mark.parametrize("group_by", ["entity", "all"])
@pytest.mark.parametrize(
    ("every", "zone"),
    [
        ("day", VIENNA),
        ("week", VIENNA),
        ("month", VIENNA),
        ("year", VIENNA),
        ("day", None),  # UTC by default
        ("month", "America/New_York"),
        (pd.Timedelta(hours=1), None),
        (pd.Timedelta(hours=6), VIENNA),  # durations are aligned to the epoch in UTC
        (pd.Timedelta(minutes=15), None),
        (pd.Timedelta(minutes=90), None),
    ],
)
def test_raw_steps_equal_the_oracle(engine: Engine, every, zone: str | None, group_by: str) -> None:
    step = every if isinstance(every, str) else f"{int(every.total_seconds()) // 60}m"
    got = downsample_arrow(
        engine, "energy_raw", step, group_by=group_by, aggs=specs(RAW_AGGS), zone=zone
    )
    want = expected_steps(
        rows_of(engine, "energy_raw"), "ts", every, zone or "UTC", RAW_AGGS, group_by
    )
    lead = ["step_start", "step_end"] + (["entity_id"] if group_by == "entity" else [])
    assert got.column_names == [*lead, *(f"{c}_{f}" for c, f in RAW_AGGS)]
    assert got.num_rows == len(want) and differences(got, want) == []
    keys = [(r["step_start"], r.get("entity_id") or "") for r in got.to_pylist()]
    assert keys == sorted(keys)


def test_vienna_days_last_23_and_25_hours(engine: Engine) -> None:
    got = downsample_arrow(
        engine, "energy_raw", "day", entities=["meter-0000"], aggs=["energy_kwh:count"], zone=VIENNA
    )
    lengths = {r["step_start"]: r["step_end"] - r["step_start"] for r in got.to_pylist()}
    spring, autumn = datetime(2025, 3, 29, 23, tzinfo=UTC), datetime(2025, 10, 25, 22, tzinfo=UTC)
    assert lengths[spring] == timedelta(hours=23) and lengths[autumn] == timedelta(hours=25)
    assert lengths[datetime(2025, 3, 28, 23, tzinfo=UTC)] == timedelta(hours=24)
    counts = {r["step_start"]: r["energy_kwh_count"] for r in got.to_pylist()}
    rows = rows_of(engine, "energy_raw").to_pandas()
    mine = rows[rows["entity_id"] == "meter-0000"]
    for start, hours in ((spring, 23), (autumn, 25)):
        inside = (mine["ts"] >= start) & (mine["ts"] < start + timedelta(hours=hours))
        assert counts[start] == int(mine.loc[inside, "energy_kwh"].notna().sum()) > 4 * 22


def test_nan_and_null_follow_the_rollups(engine: Engine) -> None:
    aggs = ["voltage_v:min", "voltage_v:max", "voltage_v:count", "energy_kwh:sum"]
    aggs += ["energy_kwh:count", "power_kw:avg"]
    got = downsample_arrow(engine, "energy_raw", "1h", aggs=aggs)
    cells = {(r["step_start"], r["entity_id"]): r for r in got.to_pylist()}
    nan = cells[(NAN_HOUR, NAN_METER)]
    # Every voltage NaN: min and max are NaN, and NaN counts as a value.
    assert math.isnan(nan["voltage_v_min"]) and math.isnan(nan["voltage_v_max"])
    assert nan["voltage_v_count"] == 4 and nan["energy_kwh_count"] == 4
    assert math.isnan(nan["energy_kwh_sum"]) and math.isnan(nan["power_kw_avg"])
    # Every voltage null: min and max are null (not NaN), the count 0.
    null = cells[(NULL_HOUR, NULL_METER)]
    assert null["voltage_v_min"] is None and null["voltage_v_max"] is None
    assert null["voltage_v_count"] == 0
    # Over the day, a min skips the NaNs, a max and a sum do not.
    day = downsample_arrow(
        engine, "energy_raw", "day", entities=[NAN_METER], aggs=aggs, zone=VIENNA
    ).to_pylist()
    autumn = next(r for r in day if r["step_start"] == datetime(2025, 10, 25, 22, tzinfo=UTC))
    assert 200 < autumn["voltage_v_min"] < 260 and math.isnan(autumn["voltage_v_max"])
    assert math.isnan(autumn["energy_kwh_sum"])


@pytest.mark.parametrize("group_by", ["entity", "all"])
@pytest.mark.parametrize(
    ("every", "zone"),
    [("day", VIENNA), ("week", VIENNA), ("month", VIENNA), (pd.Timedelta(hours=1), None)],
)
def test_time_range_steps_equal_the_oracle(
    engine: Engine, every, zone: str | None, group_by: str
) -> None:
    step = every if isinstance(every, str) else "1h"
    got = downsample_arrow(
        engine, "meter_ranges", step, group_by=group_by, aggs=specs(RANGE_AGGS), zone=zone
    )
    rows = rows_of(engine, "meter_ranges")
    want = expected_steps(rows, "range_start", every, zone or "UTC", RANGE_AGGS, group_by)
    assert got.num_rows == len(want) and differences(got, want) == []
    assert got.schema.field("pulses_sum").type == pa.int64()


def test_a_time_range_row_counts_in_the_step_of_its_start(engine: Engine) -> None:
    # rm-h reports whole hours; 15-minute steps hold each hour's range in its first quarter.
    got = downsample_arrow(
        engine,
        "meter_ranges",
        "15m",
        datetime(2025, 3, 30, 10, tzinfo=UTC),
        datetime(2025, 3, 30, 11, tzinfo=UTC),
        ["rm-h", "rm-1"],
        aggs=["energy_kwh:count"],
    )
    counts = {
        (r["entity_id"], r["step_start"].minute): r["energy_kwh_count"] for r in got.to_pylist()
    }
    assert counts == {("rm-1", m): 1 for m in (0, 15, 30, 45)} | {("rm-h", 0): 1}


def test_a_range_of_whole_steps_and_named_entities(engine: Engine) -> None:
    start = datetime(2025, 3, 29, 23, tzinfo=UTC)  # Vienna midnight of the 23-hour day
    end = datetime(2025, 3, 30, 22, tzinfo=UTC)
    got = downsample_arrow(
        engine, "energy_raw", "day", start, end, ["meter-0002"], aggs=specs(RAW_AGGS), zone=VIENNA
    )
    want = expected_steps(rows_of(engine, "energy_raw"), "ts", "day", VIENNA, RAW_AGGS)
    want = {k: v for k, v in want.items() if k == (start, "meter-0002")}
    assert len(want) == 1 and differences(got, want) == []
    empty = downsample_arrow(
        engine,
        "energy_raw",
        "day",
        datetime(2025, 6, 1, tzinfo=UTC),
        datetime(2025, 7, 1, tzinfo=UTC),
        aggs=["energy_kwh:sum"],
    )
    assert empty.num_rows == 0
    assert empty.column_names == ["step_start", "step_end", "entity_id", "energy_kwh_sum"]


REFUSED = {
    "unknown-column": (
        {"aggs": ["energy:sum"]},
        InvalidAggregationError,
        "no column 'energy' (columns: energy_kwh, power_kw, voltage_v, current_a)",
    ),
    "unknown-function": (
        {"aggs": ["energy_kwh:median"]},
        InvalidAggregationError,
        "'median' is not an aggregate function (one of sum, min, max, count, avg)",
    ),
    "no-aggregation": (
        {},
        InvalidAggregationError,
        "add what to compute: --agg COLUMN:FUNCTION",
    ),
    "bad-step": (
        {"every": "fortnight", "aggs": ["energy_kwh:sum"]},
        InvalidStepError,
        "--every 'fortnight' is not a step",
    ),
    "bad-zone": (
        {"aggs": ["energy_kwh:sum"], "zone": "Europe/Viena"},
        InvalidTimeZoneError,
        "--zone 'Europe/Viena' is not an IANA time zone",
    ),
    "not-a-boundary": (
        {"aggs": ["energy_kwh:sum"], "zone": VIENNA, "start": datetime(2025, 3, 30, tzinfo=UTC)},
        InvalidTimeRangeError,
        "2025-03-29T23:00:00Z and 2025-03-30T22:00:00Z",
    ),
    "bad-group-by": (
        {"aggs": ["energy_kwh:sum"], "group_by": "meter"},
        InvalidArchiveOperationError,
        "group_by 'meter' is not one of entity, all",
    ),
    "realtime": (
        {"aggs": ["energy_kwh:sum"], "realtime": True},
        InvalidArchiveOperationError,
        "is a raw archive, not a rollup",
    ),
}


@pytest.mark.parametrize(("kwargs", "error", "needle"), REFUSED.values(), ids=list(REFUSED))
def test_refusals_name_what_is_wrong(
    engine: Engine, kwargs: dict, error: type, needle: str
) -> None:
    args = {"every": "day", **kwargs}
    with pytest.raises(error) as err:
        downsample_arrow(engine, "energy_raw", **args)
    assert needle in str(err.value) and "energy_raw" in str(err.value)


def test_a_non_numeric_column_takes_count_only(engine: Engine) -> None:
    with pytest.raises(InvalidAggregationError, match=r"Avg\(status\) needs a numeric column"):
        downsample_arrow(engine, "meter_ranges", "day", aggs=["status:avg"])
    with pytest.raises(InvalidAggregationError, match=r"Sum\(status\) needs a numeric column"):
        downsample_arrow(engine, "meter_ranges", "day", aggs=["status:sum"])


def test_a_time_range_step_must_nest_the_period(engine: Engine) -> None:
    with pytest.raises(InvalidStepError, match=r"'meter_ranges' \(period 15m\).*--every 5m"):
        downsample_arrow(engine, "meter_ranges", "5m", aggs=["energy_kwh:sum"])


def test_an_archive_must_be_activated(tmp_path: Path) -> None:
    idle = Engine(catalog(), Warehouse(str(tmp_path / "warehouse")))
    with pytest.raises(ArchiveNotActivatedError, match="'energy_raw' is not activated"):
        downsample_arrow(idle, "energy_raw", "day", aggs=["energy_kwh:sum"])


def test_the_driver_aggregates_small_ranges_and_spark_large_ones(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    class SparkWanted(Exception):
        pass

    def no_spark():
        raise SparkWanted

    aggs = specs(RAW_AGGS)
    small = downsample(engine, "energy_raw", "day", aggs=aggs, zone=VIENNA, spark=no_spark)
    assert small.computed_with == "arrow"
    assert small.note is not None and "Arrow on the driver" in small.note
    # The files of an unbounded range hold every reading.
    assert f"{rows_of(engine, 'energy_raw').num_rows:,} rows" in small.note
    want = downsample_arrow(engine, "energy_raw", "day", aggs=aggs, zone=VIENNA)
    assert small.table.schema == want.schema
    assert differences(small.table, actual_steps(want), rel=0) == []  # NaN equal to NaN
    # The same range over a lower threshold asks for Spark (its rows: tests/integration).
    monkeypatch.setattr(downsampling, "QUERY_DRIVER_ROWS", 100)
    with pytest.raises(SparkWanted):
        downsample(engine, "energy_raw", "day", aggs=aggs, zone=VIENNA, spark=no_spark)
    # A range of one UTC day reads only that day's files (one partition, 96 readings a meter).
    monkeypatch.setattr(downsampling, "QUERY_DRIVER_ROWS", 96 * METERS)
    one_day = (datetime(2025, 3, 30, tzinfo=UTC), datetime(2025, 3, 31, tzinfo=UTC))
    day = downsample(engine, "energy_raw", "1h", *one_day, aggs=aggs, spark=no_spark)
    assert day.computed_with == "arrow" and day.table.num_rows == 24 * METERS
    with pytest.raises(SparkWanted):
        downsample(engine, "energy_raw", "1h", one_day[0], aggs=aggs, spark=no_spark)
