"""What a downsampling query computes, and in which zone: `--agg COLUMN:FUNCTION` and `--zone`
checked against the archive, and the steps of a raw or time-range archive (pure, no I/O)."""

from datetime import timedelta

import pytest

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.errors import (
    InvalidAggregationError,
    InvalidStepError,
    InvalidTimeZoneError,
)
from rollup_assets.model.query_aggregations import (
    check_rollup_zone,
    parse_aggregate,
    query_zone,
    rollup_aggregations,
    source_aggregations,
)
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import AggregationSpec, Alignment
from rollup_assets.model.steps import source_step_spec

CATALOG = load_catalog()
RAW = CATALOG.raw["energy_raw"]
MIXED = parse_catalog(
    {
        "raw_archives": {
            "mixed_raw": {
                "columns": {
                    "reading": {"type": "double", "required": True},
                    "pulses": "int",
                    "ok": "boolean",
                    "note": "string",
                    "seen": "timestamp",
                }
            }
        }
    }
).raw["mixed_raw"]


def ranges(period: str | None):
    doc = {"columns": {"energy_kwh": {"type": "double", "required": True}}}
    if period is not None:
        doc["period"] = period
    return parse_catalog({"time_range_archives": {"meter_ranges": doc}}).time_range["meter_ranges"]


@pytest.mark.parametrize(
    ("text", "column", "function"),
    [
        ("energy_kwh:sum", "energy_kwh", AggregateFunction.SUM),
        ("energy_kwh:SUM", "energy_kwh", AggregateFunction.SUM),
        (" voltage_v : Max ", "voltage_v", AggregateFunction.MAX),
        ("power_kw:avg", "power_kw", AggregateFunction.AVG),
        ("energy_kwh:count", "energy_kwh", AggregateFunction.COUNT),
        (("voltage_v", "min"), "voltage_v", AggregateFunction.MIN),
    ],
)
def test_aggregates_parse_in_any_case(text, column: str, function: AggregateFunction) -> None:
    assert parse_aggregate("energy_raw", text) == (column, function)


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("energy_kwh", "--agg 'energy_kwh' is not COLUMN:FUNCTION"),
        ("energy_kwh:median", "'median' is not an aggregate function"),
        ("energy_kwh:sum:max", "'sum:max' is not an aggregate function"),
        ("energy_kwh:", "'' is not an aggregate function"),
        (":sum", "names no column"),
    ],
)
def test_malformed_aggregates_are_refused_naming_them(text: str, needle: str) -> None:
    with pytest.raises(InvalidAggregationError) as err:
        parse_aggregate("energy_raw", text)
    assert needle in str(err.value) and "'energy_raw'" in str(err.value)
    if "function" in needle:
        assert "sum, min, max, count, avg" in str(err.value)


def test_source_aggregations_keep_the_order_and_name_outputs_as_rollups() -> None:
    aggs = source_aggregations(RAW, ["voltage_v:max", "energy_kwh:Sum", "current_a:avg"])
    assert [a.output_name for a in aggs] == ["voltage_v_max", "energy_kwh_sum", "current_a_avg"]
    assert aggs[1] == AggregationSpec("energy_kwh", AggregateFunction.SUM)


def test_an_unknown_column_is_named_with_the_archive_columns() -> None:
    with pytest.raises(InvalidAggregationError) as err:
        source_aggregations(RAW, ["energy_kwh:sum", "energy:sum"])
    text = str(err.value)
    assert "no column 'energy'" in text
    assert "columns: energy_kwh, power_kw, voltage_v, current_a" in text


@pytest.mark.parametrize("column", ["ok", "note", "seen"])
@pytest.mark.parametrize("function", ["sum", "avg", "min", "max"])
def test_only_count_applies_to_a_non_numeric_column(column: str, function: str) -> None:
    with pytest.raises(InvalidAggregationError) as err:
        source_aggregations(MIXED, [f"{column}:{function}"])
    assert f"({column}) needs a numeric column" in str(err.value)
    assert source_aggregations(MIXED, [f"{column}:count"])[0].output_name == f"{column}_count"
    assert source_aggregations(MIXED, [f"pulses:{function}"])[0].column == "pulses"


def test_no_aggregation_says_what_to_add() -> None:
    with pytest.raises(InvalidAggregationError) as err:
        source_aggregations(RAW, [])
    text = str(err.value)
    assert "'energy_raw' is a raw archive" in text
    assert "add what to compute: --agg COLUMN:FUNCTION" in text and "energy_kwh:sum" in text
    with pytest.raises(InvalidAggregationError, match="time-range archive"):
        source_aggregations(ranges("15m"), ())


def test_an_aggregation_given_twice_is_refused() -> None:
    with pytest.raises(InvalidAggregationError, match="energy_kwh:sum is given twice"):
        source_aggregations(RAW, ["energy_kwh:sum", "energy_kwh:SUM"])


def test_a_rollup_aggregation_is_picked_among_its_own() -> None:
    daily = CATALOG.rollup("energy_daily")
    assert rollup_aggregations(daily, ()) == daily.aggregations
    picked = rollup_aggregations(daily, ["voltage_v:max", "power_kw:avg"])
    assert [a.output_name for a in picked] == ["voltage_v_max", "power_kw_avg"]
    with pytest.raises(InvalidAggregationError) as err:
        rollup_aggregations(daily, ["power_kw:sum"])
    text = str(err.value)
    assert "keeps no Sum(power_kw)" in text and "energy_kwh:sum, energy_kwh:count" in text
    with pytest.raises(InvalidAggregationError, match="'nope' is not an aggregate function"):
        rollup_aggregations(daily, ["power_kw:nope"])


@pytest.mark.parametrize("zone", ["Europe/Viena", "Europe", "", "utc", "/etc/localtime", "+01:00"])
def test_a_zone_that_is_not_iana_is_refused_naming_it(zone: str) -> None:
    with pytest.raises(InvalidTimeZoneError) as err:
        query_zone("energy_raw", zone)
    assert f"--zone {zone!r} is not an IANA time zone" in str(err.value)


def test_the_zone_defaults_to_utc_and_a_rollup_keeps_its_own() -> None:
    assert query_zone("energy_raw", None) == "UTC"
    assert query_zone("energy_raw", "America/New_York") == "America/New_York"
    daily = CATALOG.rollup("energy_daily")
    check_rollup_zone(daily, None)
    check_rollup_zone(daily, "Europe/Vienna")
    with pytest.raises(InvalidTimeZoneError, match="kept in Europe/Vienna"):
        check_rollup_zone(daily, "UTC")
    with pytest.raises(InvalidTimeZoneError, match="not an IANA time zone"):
        check_rollup_zone(daily, "Vienna")


@pytest.mark.parametrize(
    ("every", "alignment", "size"),
    [
        ("day", Alignment.CALENDAR_DAY, None),
        ("Week", Alignment.ISO8601_WEEK, None),
        ("month", Alignment.CALENDAR_MONTH, None),
        ("year", Alignment.CALENDAR_YEAR, None),
        ("15m", Alignment.FIXED_SIZE, timedelta(minutes=15)),
        ("90m", Alignment.FIXED_SIZE, timedelta(minutes=90)),  # readings are instants
        ("PT6H", Alignment.FIXED_SIZE, timedelta(hours=6)),
        (timedelta(hours=7), Alignment.FIXED_SIZE, timedelta(hours=7)),
    ],
)
def test_any_step_holds_raw_readings(every, alignment: Alignment, size) -> None:
    aggs = source_aggregations(RAW, ["energy_kwh:sum", "voltage_v:min"])
    step = source_step_spec(RAW, every, "Europe/Vienna", aggs)
    assert (step.alignment, step.size) == (alignment, size)
    assert step.name == "energy_raw" and step.reference_time_zone == "Europe/Vienna"
    assert step.output_names == ("energy_kwh_sum", "voltage_v_min")
    assert [c.name for c in step.stored_columns] == ["energy_kwh_sum", "voltage_v_min"]


def test_an_int_sum_is_kept_as_long_as_in_rollups() -> None:
    step = source_step_spec(MIXED, "day", "UTC", source_aggregations(MIXED, ["pulses:sum"]))
    assert step.stored_columns[0].type.value == "long"


@pytest.mark.parametrize("every", ["fortnight", "", "-1h", "0s", "1.5h"])
def test_bad_steps_over_a_raw_archive_are_refused_naming_them(every: str) -> None:
    with pytest.raises(InvalidStepError) as err:
        source_step_spec(RAW, every, "UTC", source_aggregations(RAW, ["energy_kwh:sum"]))
    assert "cannot downsample 'energy_raw'" in str(err.value)
    assert repr(every) in str(err.value)


@pytest.mark.parametrize(
    ("period", "every", "zone", "why"),
    [
        ("15m", "5m", "UTC", "finer than"),
        ("15m", "20m", "UTC", "not an integer multiple"),
        ("2h", "day", "Europe/Vienna", "local midnight in Europe/Vienna"),
        ("1d", "day", "Europe/Vienna", "local midnight in Europe/Vienna"),
        ("1d", "12h", "UTC", "finer than"),
    ],
)
def test_a_step_that_would_split_time_ranges_is_refused(
    period: str, every: str, zone: str, why: str
) -> None:
    source = ranges(period)
    aggs = source_aggregations(source, ["energy_kwh:sum"])
    with pytest.raises(InvalidStepError) as err:
        source_step_spec(source, every, zone, aggs)
    text = str(err.value)
    assert "cannot downsample 'meter_ranges'" in text and f"--every {every}" in text
    assert "no step splits a row" in text and why in text


@pytest.mark.parametrize(
    ("period", "every", "zone"),
    [
        ("15m", "15m", "UTC"),
        ("15m", "1h", "Europe/Vienna"),
        ("15m", "day", "Europe/Vienna"),
        ("15m", "month", "Asia/Kolkata"),  # +05:30: a whole number of quarter hours
        ("2h", "day", "UTC"),
        (None, "5m", "UTC"),  # no declared period: nothing to nest
    ],
)
def test_steps_that_nest_the_declared_period(period: str | None, every: str, zone: str) -> None:
    source = ranges(period)
    step = source_step_spec(source, every, zone, source_aggregations(source, ["energy_kwh:max"]))
    assert step.output_names == ("energy_kwh_max",)
