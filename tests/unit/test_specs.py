"""Spec loading and validation: the shipped spec loads, and every rule rejects a spec breaking it.

Every rejection must name the archive at fault and the rule it breaks, in the exception's fields
and in its message.
"""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.describe import describe
from rollup_assets.model.durations import format_duration, parse_duration
from rollup_assets.model.errors import SpecError
from rollup_assets.model.grid import partition_grid
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Alignment, Catalog
from rollup_assets.model.windows import EPOCH
from rollup_assets.settings import DEFAULT_SPECS, Settings

OUTPUTS = (
    "energy_kwh_sum",
    "energy_kwh_count",
    "power_kw_avg",
    "voltage_v_min",
    "voltage_v_max",
    "current_a_max",
)


def raw_archives() -> dict[str, Any]:
    return {
        "meter": {
            "columns": {
                "kwh": {"type": "double", "required": True},
                "pulses": "long",
                "label": "string",
                "online": "boolean",
            }
        }
    }


def agg(column: str = "kwh", function: str = "Sum", **extra: str) -> dict[str, str]:
    return {"column": column, "function": function, **extra}


def rollup(
    source: str = "meter",
    alignment: str = "FixedSize",
    size: str | None = "1h",
    zone: str = "Europe/Vienna",
    start: str | None = "2024-01-01",
    aggregations: list[dict[str, str]] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "source": source,
        "alignment": alignment,
        "reference_time_zone": zone,
        "aggregations": aggregations or [agg(), agg(function="Count")],
        **extra,
    }
    if size is not None:
        body["size"] = size
    if start is not None:
        body["start"] = start
    return body


def level(source: str, alignment: str, **kw: Any) -> dict[str, Any]:
    """A rollup above another rollup: no size, start inherited."""
    return rollup(source, alignment, **{"size": None, "start": None, **kw})


def catalog(**rollups: dict[str, Any]) -> dict[str, Any]:
    return {"raw_archives": raw_archives(), "rollups": rollups}


def chain(**extra: dict[str, Any]) -> dict[str, Any]:
    """hourly -> daily -> weekly / monthly -> yearly in Vienna, plus `extra` rollups."""
    return catalog(
        hourly=rollup(),
        daily=level("hourly", "CalendarDay"),
        weekly=level("daily", "Iso8601Week"),
        monthly=level("daily", "CalendarMonth"),
        yearly=level("monthly", "CalendarYear"),
        **extra,
    )


def rejected(doc: dict[str, Any], archive: str, rule: str, *fragments: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        parse_catalog(doc)
    err = info.value
    assert (err.archive, err.rule) == (archive, rule), str(err)
    assert f"'{archive}'" in str(err) and f"[{rule}]" in str(err)
    for fragment in fragments:
        assert fragment in str(err)
    return err


# ---------------------------------------------------------------------------------------------
# The shipped spec


def test_shipped_spec_loads_the_energy_chain() -> None:
    cat = load_catalog(DEFAULT_SPECS)
    assert list(cat.raw) == ["energy_raw"]
    raw = cat.raw["energy_raw"]
    assert [(c.name, c.type, c.required) for c in raw.columns] == [
        ("energy_kwh", ColumnType.DOUBLE, True),
        ("power_kw", ColumnType.DOUBLE, False),
        ("voltage_v", ColumnType.DOUBLE, False),
        ("current_a", ColumnType.DOUBLE, False),
    ]
    computed = raw.column("current_a")
    assert computed is not None and computed.formula is not None
    assert computed.formula.columns == {"power_kw", "voltage_v"}
    assert [c.name for c in raw.computed_columns] == ["current_a"]
    expected = {
        "energy_hourly": ("energy_raw", Alignment.FIXED_SIZE, timedelta(hours=1)),
        "energy_daily": ("energy_hourly", Alignment.CALENDAR_DAY, None),
        "energy_weekly": ("energy_daily", Alignment.ISO8601_WEEK, None),
        "energy_monthly": ("energy_daily", Alignment.CALENDAR_MONTH, None),
        "energy_yearly": ("energy_monthly", Alignment.CALENDAR_YEAR, None),
    }
    assert len(cat.rollups) == 5
    assert {n: (r.source, r.alignment, r.size) for n, r in cat.rollups.items()} == expected
    for r in cat.rollups.values():
        assert r.output_names == OUTPUTS
        assert r.reference_time_zone == "Europe/Vienna"
        assert r.start == datetime(2024, 1, 1)
        assert r.watermark_lag == timedelta(minutes=5)
        assert r.refresh_open_bucket is True
        assert [a.function for a in r.aggregations] == [
            AggregateFunction.SUM,
            AggregateFunction.COUNT,
            AggregateFunction.AVG,
            AggregateFunction.MIN,
            AggregateFunction.MAX,
            AggregateFunction.MAX,
        ]
    # Rollups come in dependency order, sources first.
    names = list(cat.rollups)
    for r in cat.rollups.values():
        if r.source in cat.rollups:
            assert names.index(r.source) < names.index(r.name)
    assert cat.base_source("energy_weekly").name == "energy_raw"


def test_shipped_spec_stores_avg_as_sum_and_count() -> None:
    hourly = load_catalog(DEFAULT_SPECS).rollups["energy_hourly"]
    assert [(s.name, s.partial, s.type) for s in hourly.stored_columns] == [
        ("energy_kwh_sum", "sum", ColumnType.DOUBLE),
        ("energy_kwh_count", "count", ColumnType.LONG),
        ("power_kw_avg__sum", "sum", ColumnType.DOUBLE),
        ("power_kw_avg__count", "count", ColumnType.LONG),
        ("voltage_v_min", "min", ColumnType.DOUBLE),
        ("voltage_v_max", "max", ColumnType.DOUBLE),
        ("current_a_max", "max", ColumnType.DOUBLE),
    ]


def test_rollups_specs_env_var_points_to_another_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(catalog(hourly=rollup(zone="UTC"))))
    settings = Settings.from_env({"ROLLUPS_SPECS": str(other)})
    assert settings.specs == other
    cat = load_catalog(settings.specs)
    assert cat.origin == str(other)
    assert list(cat.rollups) == ["hourly"] and list(cat.raw) == ["meter"]

    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(catalog(hourly=rollup(source="nowhere"))))
    with pytest.raises(SpecError) as info:
        load_catalog(Settings.from_env({"ROLLUPS_SPECS": str(broken)}).specs)
    assert (info.value.archive, info.value.rule) == ("hourly", "known source")

    assert Settings.from_env({}).specs == DEFAULT_SPECS
    # Below the edges nothing reads the environment: without a path, the bundled spec loads
    # whatever $ROLLUPS_SPECS says.
    monkeypatch.setenv("ROLLUPS_SPECS", str(broken))
    assert load_catalog().origin == str(DEFAULT_SPECS)
    assert "energy_hourly" in load_catalog().rollups


# ---------------------------------------------------------------------------------------------
# Valid edge cases


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(catalog(q=rollup(size="15m")), id="15m-in-vienna"),
        pytest.param(catalog(q=rollup(size="PT15M")), id="iso-duration"),
        pytest.param(catalog(h=rollup(size="2h", zone="UTC")), id="2h-in-utc"),
        pytest.param(catalog(h=rollup(size="1d", zone="UTC")), id="1d-in-utc"),
        pytest.param(catalog(h=rollup(size="30m", zone="Asia/Kolkata")), id="30m-in-kolkata"),
        pytest.param(catalog(h=rollup(size="15m", zone="Asia/Kathmandu")), id="15m-in-kathmandu"),
        pytest.param(
            catalog(h=rollup(size="30m", zone="Australia/Lord_Howe")), id="30m-dst-lord-howe"
        ),
        pytest.param(chain(), id="week-over-day-year-over-month"),
        pytest.param(
            catalog(h=rollup(), y=level("h", "CalendarYear"), m=level("h", "CalendarMonth")),
            id="year-and-month-over-hours",
        ),
        pytest.param(
            catalog(
                h=rollup(zone="UTC"), h2=rollup("h", size="2h", zone="UTC", start="2024-06-01")
            ),
            id="2h-over-1h-later-start",
        ),
        pytest.param(catalog(d=rollup(alignment="CalendarDay", size=None)), id="day-over-raw"),
        pytest.param(chain(weekly2=level("weekly", "Iso8601Week")), id="week-over-week"),
        pytest.param(
            catalog(h=rollup(aggregations=[agg("label", "Count"), agg("online", "Count")])),
            id="count-of-string-and-boolean",
        ),
        pytest.param(
            catalog(h=rollup(aggregations=[agg("pulses", f) for f in ("Sum", "Min", "Avg")])),
            id="long-column",
        ),
        pytest.param(
            catalog(
                h=rollup(aggregations=[agg(function="Avg")]),
                d=level("h", "CalendarDay", aggregations=[agg(function="Count")]),
            ),
            id="count-from-avg-partials",
        ),
        pytest.param(
            catalog(h=rollup(aggregations=[agg(target="total"), agg(function="Max")])), id="target"
        ),
        pytest.param(catalog(h=rollup(start="2024-01-01T00:30:00")), id="start-mid-bucket"),
        pytest.param({"raw_archives": raw_archives()}, id="no-rollups"),
    ],
)
def test_valid_specs_load(doc: dict[str, Any]) -> None:
    cat = parse_catalog(doc)
    assert isinstance(cat, Catalog)
    assert list(cat.raw) == ["meter"]
    assert set(cat.rollups) == set(doc.get("rollups", {}))


def test_rollup_over_a_time_range_archive_with_a_period() -> None:
    doc = {
        "time_range_archives": {
            "tariff": {"period": "15m", "columns": {"price": {"type": "double", "required": True}}}
        },
        "rollups": {
            "tariff_hourly": rollup("tariff", aggregations=[agg("price", "Avg")]),
            "tariff_daily": level(
                "tariff_hourly", "CalendarDay", aggregations=[agg("price", "Avg")]
            ),
        },
    }
    cat = parse_catalog(doc)
    assert cat.time_range["tariff"].period == timedelta(minutes=15)
    assert cat.base_source("tariff_daily").name == "tariff"
    assert cat.rollups["tariff_daily"].output_names == ("price_avg",)


def quarter_hour_archive(**rollups: dict[str, Any]) -> dict[str, Any]:
    """A time-range archive declaring a 15-minute period, with `rollups`."""
    return {
        "time_range_archives": {"q": {"period": "15m", "columns": {"x": "double"}}},
        "rollups": rollups,
    }


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(rollup("q", size="15m", aggregations=[agg("x")]), id="15m"),
        pytest.param(rollup("q", size="30m", aggregations=[agg("x")]), id="30m"),
        pytest.param(rollup("q", size="1h", aggregations=[agg("x")]), id="1h"),
        pytest.param(rollup("q", "CalendarDay", size=None, aggregations=[agg("x")]), id="day"),
        pytest.param(rollup("q", "Iso8601Week", size=None, aggregations=[agg("x")]), id="week"),
        pytest.param(rollup("q", "CalendarMonth", size=None, aggregations=[agg("x")]), id="month"),
        pytest.param(rollup("q", "CalendarYear", size=None, aggregations=[agg("x")]), id="year"),
    ],
)
def test_buckets_that_are_whole_multiples_of_the_period_load(body: dict[str, Any]) -> None:
    cat = parse_catalog(quarter_hour_archive(r=body))
    assert [r.name for r in cat.time_range["q"].first_levels] == ["r"]


@pytest.mark.parametrize(
    ("size", "zone", "fragment"),
    [
        pytest.param("5m", "Europe/Vienna", "finer", id="5m-finer"),
        pytest.param("10m", "UTC", "finer", id="10m-finer"),
        pytest.param("20m", "Europe/Vienna", "not an integer multiple", id="20m"),
    ],
)
def test_buckets_that_would_split_a_period_are_refused(size: str, zone: str, fragment: str) -> None:
    doc = quarter_hour_archive(r=rollup("q", size=size, zone=zone, aggregations=[agg("x")]))
    rejected(doc, "r", "bucket nests in source", fragment, "'q'")


@pytest.mark.parametrize(
    ("period", "zone", "loads"),
    [
        pytest.param("1d", "UTC", True, id="utc-day-over-days"),
        pytest.param("1h", "Europe/Vienna", True, id="vienna-day-over-hours"),
        pytest.param("30m", "Asia/Kolkata", True, id="kolkata-day-over-half-hours"),
        pytest.param("1h", "Asia/Kolkata", False, id="kolkata-day-over-hours"),
        pytest.param("2h", "Europe/Vienna", False, id="vienna-day-over-2h"),
        pytest.param("7h", "UTC", False, id="7h-does-not-divide-a-day"),
        pytest.param("2d", "UTC", False, id="longer-than-a-day"),
    ],
)
def test_calendar_day_over_a_period_must_start_on_its_boundaries(
    period: str, zone: str, loads: bool
) -> None:
    doc = {
        "time_range_archives": {"t": {"period": period, "columns": {"x": "double"}}},
        "rollups": {"d": rollup("t", "CalendarDay", size=None, zone=zone, aggregations=[agg("x")])},
    }
    if loads:
        assert parse_catalog(doc).time_range["t"].first_levels[0].name == "d"
    else:
        rejected(doc, "d", "bucket nests in source", "'t'")


def test_a_time_range_archive_knows_only_the_rollups_built_from_it() -> None:
    doc = quarter_hour_archive(
        h=rollup("q", aggregations=[agg("x")]),
        d=level("h", "CalendarDay", aggregations=[agg("x")]),
        d2=rollup("q", "CalendarDay", size=None, aggregations=[agg("x")]),
    )
    cat = parse_catalog(doc)
    assert [r.name for r in cat.time_range["q"].first_levels] == ["h", "d2"]
    # Which rollups use it is no part of the archive's identity or its schema.
    declared = parse_catalog(quarter_hour_archive()).time_range["q"]
    assert declared.first_levels == () and declared == cat.time_range["q"]
    assert "[range_start, range_end); period 15m" in describe(declared, cat)


def test_levels_inherit_the_chain_start_and_keep_a_later_one() -> None:
    doc = chain(later=level("daily", "CalendarMonth", start="2024-03-01"))
    cat = parse_catalog(doc)
    assert {r.start for n, r in cat.rollups.items() if n != "later"} == {datetime(2024, 1, 1)}
    assert cat.rollups["later"].start == datetime(2024, 3, 1)


def test_missing_zone_means_utc() -> None:
    body = rollup()
    del body["reference_time_zone"]
    assert parse_catalog(catalog(h=body)).rollups["h"].reference_time_zone == "UTC"


# ---------------------------------------------------------------------------------------------
# One failing spec per rule


def test_unknown_source() -> None:
    rejected(catalog(h=rollup(source="missing")), "h", "known source", "'missing'")


def test_unknown_column() -> None:
    rejected(catalog(h=rollup(aggregations=[agg("kw")])), "h", "known column", "'kw'")


def test_column_the_source_rollup_does_not_aggregate() -> None:
    doc = catalog(h=rollup(), d=level("h", "CalendarDay", aggregations=[agg(function="Max")]))
    rejected(doc, "d", "known column", "Max(kwh)")


def test_aggregating_the_entity_or_time_column_is_unknown() -> None:
    rejected(catalog(h=rollup(aggregations=[agg("ts", "Count")])), "h", "known column")


def test_self_source_is_a_cycle() -> None:
    rejected(catalog(h=rollup(source="h")), "h", "no cycles", "h -> h")


def test_longer_cycle() -> None:
    doc = catalog(
        a=level("c", "CalendarDay"), b=level("a", "CalendarDay"), c=level("b", "CalendarDay")
    )
    rejected(doc, "a", "no cycles", "a -> c -> b -> a")


def test_cycle_hanging_off_a_valid_chain() -> None:
    doc = catalog(h=rollup(), d=level("h", "CalendarDay"), x=level("y", "CalendarDay"))
    doc["rollups"]["y"] = level("x", "CalendarDay")
    rejected(doc, "x", "no cycles", "x -> y -> x")


@pytest.mark.parametrize(
    ("doc", "archive", "fragment"),
    [
        pytest.param(catalog(h=rollup(), q=rollup("h", size="15m")), "q", "finer", id="finer"),
        pytest.param(
            catalog(h=rollup(size="2h", zone="UTC"), q=rollup("h", size="3h", zone="UTC")),
            "q",
            "not an integer multiple",
            id="not-a-multiple",
        ),
        pytest.param(
            chain(m2=level("weekly", "CalendarMonth")), "m2", "ISO weeks", id="week-month"
        ),
        pytest.param(chain(y2=level("weekly", "CalendarYear")), "y2", "ISO weeks", id="week-year"),
        pytest.param(chain(d2=level("monthly", "CalendarDay")), "d2", "finer", id="day-over-month"),
        pytest.param(chain(w2=level("monthly", "Iso8601Week")), "w2", "finer", id="week-month"),
        pytest.param(chain(m2=level("yearly", "CalendarMonth")), "m2", "finer", id="month-year"),
        pytest.param(
            chain(f=rollup("daily", size="1h", start=None)), "f", "length varies", id="fixed-day"
        ),
        pytest.param(
            {
                "time_range_archives": {"t": {"period": "7m", "columns": {"x": "double"}}},
                "rollups": {"h": rollup("t", aggregations=[agg("x")])},
            },
            "h",
            "not an integer multiple",
            id="hour-over-7m-ranges",
        ),
        pytest.param(
            {
                "time_range_archives": {"t": {"period": "1d", "columns": {"x": "double"}}},
                "rollups": {"d": rollup("t", "CalendarDay", size=None, aggregations=[agg("x")])},
            },
            "d",
            "local midnight in Europe/Vienna",
            id="vienna-day-over-utc-days",
        ),
    ],
)
def test_bucket_that_does_not_nest_in_its_source(
    doc: dict[str, Any], archive: str, fragment: str
) -> None:
    rejected(doc, archive, "bucket nests in source", fragment)


@pytest.mark.parametrize(
    ("size", "zone", "step", "per_bucket"),
    [
        ("2h", "Europe/Vienna", "1h", 2),
        ("1h", "Asia/Kolkata", "1h", 1),  # one offset: hourly partitions at local :30
        ("30m", "Asia/Kathmandu", "30m", 1),  # at local :15 and :45
        ("1h", "Australia/Lord_Howe", "30m", 2),  # half-hour DST
        ("1d", "Europe/Vienna", "1h", 24),
        ("3h", "America/New_York", "1h", 3),
    ],
)
def test_fixed_size_buckets_ignore_the_zone_offsets(
    size: str, zone: str, step: str, per_bucket: int
) -> None:
    """A FixedSize bucket is UTC time from its origin, whatever offsets the zone uses (these
    were refused before origins existed); the zone only decides the local times Dagster's
    partitions start at, and may make it cut a bucket into several partitions."""
    cat = parse_catalog(catalog(h=rollup(size=size, zone=zone)))
    spec = cat.rollups["h"]
    grid = partition_grid(spec)
    assert grid is not None and (format_duration(grid.step), grid.per_bucket) == (step, per_bucket)
    split = f"{per_bucket} partitions of {step} per bucket"
    assert (split in describe(spec, cat)) is (per_bucket > 1)


@pytest.mark.parametrize("size", ["2d", "25h", "90m", "7m", "45m", "5h", "7h", "1w", "P7D"])
def test_any_whole_number_of_minutes_up_to_a_week_loads(size: str) -> None:
    spec = parse_catalog(catalog(h=rollup(size=size, zone="UTC"))).rollups["h"]
    assert spec.size == parse_duration(size)


@pytest.mark.parametrize("size", ["8d", "2w", "169h", "10081m"])
def test_fixed_size_longer_than_a_week(size: str) -> None:
    rejected(catalog(h=rollup(size=size, zone="UTC")), "h", "bucket size", "longer than 7d")


@pytest.mark.parametrize("size", ["30s", "0s", "90s", "PT1M30S"])
def test_fixed_size_is_a_whole_number_of_minutes(size: str) -> None:
    rejected(
        catalog(h=rollup(size=size, zone="UTC")), "h", "bucket size", "whole number of minutes"
    )


@pytest.mark.parametrize(
    ("origin", "expected"),
    [
        ("2024-01-01T00:30:00Z", datetime(2024, 1, 1, 0, 30, tzinfo=UTC)),
        ("2024-01-01T01:30:00+01:00", datetime(2024, 1, 1, 0, 30, tzinfo=UTC)),
        (datetime(2024, 1, 1, 6, tzinfo=UTC), datetime(2024, 1, 1, 6, tzinfo=UTC)),
        ("1969-12-31T18:00:00-06:00", EPOCH),
    ],
)
def test_origin_is_an_instant_kept_in_utc(origin: Any, expected: datetime) -> None:
    spec = parse_catalog(catalog(h=rollup(size="90m", origin=origin))).rollups["h"]
    assert spec.origin == expected and spec.origin.utcoffset() == timedelta(0)


def test_origin_defaults_to_the_epoch_and_leaves_the_fingerprint_as_it_was() -> None:
    spec = parse_catalog(catalog(h=rollup())).rollups["h"]
    assert spec.origin == EPOCH
    assert spec.schema_fingerprint() == (
        "rollup|meter|FixedSize|1:00:00|Europe/Vienna|2024-01-01T00:00:00|"
        "kwh:Sum:kwh_sum,kwh:Count:kwh_count"
    )
    moved = parse_catalog(catalog(h=rollup(origin="2024-01-01T00:30:00Z"))).rollups["h"]
    assert moved.schema_fingerprint() != spec.schema_fingerprint()
    assert "2024-01-01T00:30:00+00:00" in moved.schema_fingerprint()


@pytest.mark.parametrize(
    "origin",
    [
        "2024-01-01",
        "2024-01-01T00:30:00",
        datetime(2024, 1, 1, 0, 30),
        "soon",
        1800,
        True,
        "0001-01-01T00:00:00+01:00",  # before year 1 in UTC
        "9999-12-31T23:30:00-01:00",  # past 9999 in UTC
    ],
)
def test_origin_needs_its_offset(origin: Any) -> None:
    rejected(catalog(h=rollup(origin=origin)), "h", "origin", "UTC offset")


def test_origin_on_a_whole_minute() -> None:
    rejected(catalog(h=rollup(origin="2024-01-01T00:30:30Z")), "h", "origin", "whole minute")


def test_origin_only_applies_to_fixed_size() -> None:
    doc = chain(d2=level("hourly", "CalendarDay", origin="2024-01-01T00:00:00Z"))
    rejected(doc, "d2", "origin", "only applies to FixedSize", "local midnight")


@pytest.mark.parametrize(
    ("size", "zone", "step", "per_bucket"),
    [
        pytest.param("7d", "Australia/Lord_Howe", "30m", 336, id="week-half-hour-dst"),
        pytest.param("P6DT30M", "Europe/Vienna", "30m", 289, id="6d-30m"),
        pytest.param("5000m", "UTC", "20m", 250, id="5000m"),
    ],
)
def test_buckets_dagster_cannot_partition_in_few_enough_pieces(
    size: str, zone: str, step: str, per_bucket: int
) -> None:
    rejected(
        catalog(h=rollup(size=size, zone=zone)),
        "h",
        "partitions align with buckets",
        f"partitions of {step} in {zone}, {per_bucket} per bucket (at most 168)",
    )


def test_buckets_no_cron_schedule_can_partition() -> None:
    """Monrovia kept a UTC offset of -0:44:30 until 1972: no local minute is a UTC hour."""
    doc = catalog(h=rollup(size="1h", zone="Africa/Monrovia", start="1960-01-01"))
    rejected(doc, "h", "partitions align with buckets", "not a whole number of minutes")
    assert parse_catalog(catalog(h=rollup(size="1h", zone="Africa/Monrovia", start="1973-01-01")))


@pytest.mark.parametrize(
    ("size", "origin", "zone", "step", "per_bucket"),
    [
        pytest.param("90m", None, "Europe/Vienna", "30m", 3, id="90m"),
        pytest.param("90m", "2024-01-01T00:15:00Z", "Europe/Vienna", "30m", 3, id="90m-at-15"),
        pytest.param("90m", "2024-01-01T00:10:00Z", "Europe/Vienna", "30m", 3, id="90m-at-10"),
        pytest.param("7d", "2024-01-01T00:30:00Z", "Europe/Vienna", "1h", 168, id="week-at-30"),
        pytest.param("3d", None, "Australia/Lord_Howe", "30m", 144, id="3d-lord-howe"),
        pytest.param("2d", None, "Europe/Vienna", "1h", 48, id="2d-vienna"),
        pytest.param("2d", None, "UTC", "1d", 2, id="2d-utc"),
        pytest.param("7d", "2024-01-01T00:30:00Z", "UTC", "1d", 7, id="week-from-half-past-utc"),
        pytest.param("7d", None, "Europe/Vienna", "1h", 168, id="week-vienna"),
        pytest.param("5h", None, "Europe/Vienna", "1h", 5, id="5h"),
        pytest.param("2d", "2024-01-01T00:00:00+05:30", "Asia/Kolkata", "1d", 2, id="2d-kolkata"),
        pytest.param("1h", None, "Europe/Vienna", "1h", 1, id="hourly-as-before"),
        pytest.param("1d", None, "UTC", "1d", 1, id="daily-utc-as-before"),
    ],
)
def test_partition_grid_is_the_coarsest_cron_grid_through_every_boundary(
    size: str, origin: str | None, zone: str, step: str, per_bucket: int
) -> None:
    extra = {"origin": origin} if origin else {}
    spec = parse_catalog(catalog(h=rollup(size=size, zone=zone, **extra))).rollups["h"]
    grid = partition_grid(spec)
    assert grid is not None and (format_duration(grid.step), grid.per_bucket) == (step, per_bucket)


HALF_PAST = "2024-01-01T00:30:00Z"


def period_archive(period: str, **rollups: dict[str, Any]) -> dict[str, Any]:
    return {
        "time_range_archives": {"t": {"period": period, "columns": {"kwh": "double"}}},
        "rollups": rollups,
    }


@pytest.mark.parametrize(
    "doc",
    [
        pytest.param(
            catalog(h=rollup(size="30m"), q=rollup("h", size="90m", origin=HALF_PAST)),
            id="90m-from-half-past-over-30m",
        ),
        pytest.param(catalog(h=rollup(), d2=rollup("h", size="2d")), id="2d-over-hourly"),
        pytest.param(catalog(q=rollup(size="90m"), d2=rollup("q", size="2d")), id="2d-over-90m"),
        pytest.param(
            catalog(q=rollup(size="90m", zone="UTC"), d=level("q", "CalendarDay", zone="UTC")),
            id="utc-day-over-90m",
        ),
        pytest.param(
            catalog(h=rollup(size="30m", origin=HALF_PAST), d=level("h", "CalendarDay")),
            id="vienna-day-over-30m-from-half-past",
        ),
        pytest.param(
            catalog(
                h=rollup(zone="Asia/Kolkata", origin=HALF_PAST),
                d=level("h", "CalendarDay", zone="Asia/Kolkata"),
                m=level("d", "CalendarMonth", zone="Asia/Kolkata"),
            ),
            id="kolkata-day-over-hours-at-half-past",
        ),
        pytest.param(
            catalog(
                w=rollup(size="7d", origin="2024-01-01T00:00:00+01:00"),
                w2=rollup("w", size="7d", origin="2024-01-08T00:00:00+01:00"),
            ),
            id="week-over-week-a-week-later",
        ),
        pytest.param(
            period_archive("15m", q=rollup("t", size="90m", origin=HALF_PAST)),
            id="90m-over-15m-ranges",
        ),
    ],
)
def test_fixed_size_buckets_that_nest(doc: dict[str, Any]) -> None:
    cat = parse_catalog(doc)
    assert set(cat.rollups) == set(doc["rollups"])


@pytest.mark.parametrize(
    ("doc", "archive", "fragments"),
    [
        pytest.param(
            catalog(h=rollup(size="30m"), q=rollup("h", size="90m", origin="2024-01-01T00:15:00Z")),
            "q",
            ("origin 2024-01-01T00:15:00Z is not a boundary of the 30m source buckets",),
            id="90m-from-quarter-past-over-30m",
        ),
        pytest.param(
            catalog(h=rollup(), q=rollup("h", size="90m")),
            "q",
            ("not an integer multiple",),
            id="90m-over-hourly",
        ),
        pytest.param(
            catalog(q=rollup(size="90m"), d=level("q", "CalendarDay")),
            "d",
            ("local midnight in Europe/Vienna",),
            id="vienna-day-over-90m",
        ),
        pytest.param(
            catalog(
                h=rollup(size="30m", origin="2024-01-01T00:15:00Z"), d=level("h", "CalendarDay")
            ),
            "d",
            ("local midnight in Europe/Vienna", "counted from 2024-01-01T00:15:00Z"),
            id="vienna-day-over-30m-from-quarter-past",
        ),
        pytest.param(
            catalog(d2=rollup(size="2d", zone="UTC"), d=level("d2", "CalendarDay", zone="UTC")),
            "d",
            ("do not divide a day",),
            id="utc-day-over-2d",
        ),
        pytest.param(
            chain(d2=rollup("daily", size="2d", start=None)),
            "d2",
            ("length varies",),
            id="2d-over-vienna-days",
        ),
        pytest.param(
            catalog(d2=rollup(size="2d"), w=rollup("d2", size="7d")),
            "w",
            ("not an integer multiple",),
            id="week-over-2d",
        ),
        pytest.param(
            period_archive("1h", h=rollup("t", origin=HALF_PAST)),
            "h",
            ("origin 2024-01-01T00:30:00Z is not a boundary of the 1h source buckets",),
            id="hour-from-half-past-over-hour-ranges",
        ),
    ],
)
def test_fixed_size_buckets_that_do_not_nest(
    doc: dict[str, Any], archive: str, fragments: tuple[str, ...]
) -> None:
    rejected(doc, archive, "bucket nests in source", *fragments)


def test_fixed_size_needs_a_size() -> None:
    rejected(catalog(h=rollup(size=None)), "h", "FixedSize needs size")


def test_size_only_applies_to_fixed_size() -> None:
    rejected(chain(d2=level("hourly", "CalendarDay", size="1d")), "d2", "size", "only applies")


def test_zones_differ_along_one_chain() -> None:
    doc = chain()
    doc["rollups"]["monthly"]["reference_time_zone"] = "Europe/Berlin"  # same offsets, still no
    rejected(doc, "monthly", "one zone per chain", "Europe/Berlin", "'daily'")


@pytest.mark.parametrize("function", ["Sum", "Min", "Max", "Avg"])
@pytest.mark.parametrize("column", ["label", "online"])
def test_aggregation_on_a_non_numeric_column(column: str, function: str) -> None:
    doc = catalog(h=rollup(aggregations=[agg(column, function)]))
    rejected(doc, "h", "numeric aggregation", f"{function}({column})", "only Count")


@pytest.mark.parametrize(
    "aggregations",
    [
        [agg(), agg()],
        [agg(target="x"), agg(function="Max", target="x")],
        [agg(function="Count"), agg("pulses", target="kwh_count")],
        [agg(function="Avg"), agg(function="Min", target="KWH_AVG".lower())],
    ],
    ids=["same-twice", "same-target", "target-equals-default", "target-equals-avg"],
)
def test_duplicate_target_names(aggregations: list[dict[str, str]]) -> None:
    rejected(catalog(h=rollup(aggregations=aggregations)), "h", "unique target names")


@pytest.mark.parametrize("target", ["bucket_start", "entity_id", "Total", "a__b", "1st", "a b"])
def test_unusable_target_names(target: str) -> None:
    doc = catalog(h=rollup(aggregations=[agg(target=target)]))
    rejected(doc, "h", "target name", repr(target))


@pytest.mark.parametrize("name", ["Hourly", "energy-hourly", "a__b", "9lives", "x" * 64])
def test_bad_archive_names(name: str) -> None:
    rejected(catalog(**{name: rollup()}), name, "archive name")


def test_raw_and_rollup_names_are_unique() -> None:
    rejected(catalog(meter=rollup(source="meter")), "meter", "unique names", "raw", "rollup")


@pytest.mark.parametrize("column", ["ts", "entity_id", "day", "bucket_start", "generation"])
def test_reserved_column_names(column: str) -> None:
    doc = {"raw_archives": {"meter": {"columns": {column: "double"}}}}
    rejected(doc, "meter", "column name", "reserved")


@pytest.mark.parametrize("column", ["Power", "kw-h", "a__b"])
def test_bad_column_names(column: str) -> None:
    doc = {"raw_archives": {"meter": {"columns": {column: "double"}}}}
    rejected(doc, "meter", "column name", "lower-case")


@pytest.mark.parametrize(
    ("columns", "rule"),
    [
        ({"x": "float"}, "column type"),
        ({"x": {"type": "double", "required": "yes"}}, "column declaration"),
        ({"x": {"type": "double", "nullable": True}}, "column declaration"),
        ({"x": ["double"]}, "column declaration"),
        ({}, "has value columns"),
    ],
)
def test_bad_column_declarations(columns: dict[str, Any], rule: str) -> None:
    rejected({"raw_archives": {"meter": {"columns": columns}}}, "meter", rule)


@pytest.mark.parametrize("zone", ["Mars/Olympus_Mons", "", "CET+1", "europe/vienna", "../etc"])
def test_invalid_zone(zone: str) -> None:
    rejected(catalog(h=rollup(zone=zone)), "h", "reference_time_zone", "IANA")


def test_missing_start_on_a_chain_root() -> None:
    rejected(catalog(h=rollup(start=None)), "h", "start", "first rollup of a chain")


def test_start_before_the_source_starts() -> None:
    doc = chain()
    doc["rollups"]["daily"]["start"] = "2023-12-31"
    rejected(doc, "daily", "start", "before source 'hourly'")


@pytest.mark.parametrize(
    "start", ["yesterday", "2024-13-01", "2024-01-01T00:00:00+01:00", "2024-01-01Z"]
)
def test_unusable_start(start: str) -> None:
    rejected(catalog(h=rollup(start=start)), "h", "start")


def test_unknown_rollup_keys() -> None:
    rejected(catalog(h=rollup(timezone="UTC")), "h", "known keys", "'timezone'")


def test_unknown_raw_archive_keys() -> None:
    doc = {"raw_archives": {"meter": {"columns": {"x": "double"}, "partitioned_by": "day"}}}
    rejected(doc, "meter", "known keys", "partitioned_by")


def test_unknown_aggregation_keys() -> None:
    rejected(catalog(h=rollup(aggregations=[agg(alias="x")])), "h", "aggregation", "alias")


def test_unknown_top_level_keys() -> None:
    doc = {**catalog(h=rollup()), "rollup": {}}
    rejected(doc, "<memory>", "known top-level keys", "'rollup'")


@pytest.mark.parametrize(
    ("patch", "rule"),
    [
        ({"alignment": "Hourly"}, "alignment"),
        ({"aggregations": []}, "has aggregations"),
        ({"aggregations": [{"column": "kwh"}]}, "aggregation"),
        ({"aggregations": [agg(function="Median")]}, "aggregation function"),
        ({"aggregations": [agg(function="sum")]}, "aggregation function"),
        ({"watermark_lag": "-5m"}, "watermark_lag"),
        ({"watermark_lag": "soon"}, "watermark_lag"),
        ({"size": "1 hour"}, "size"),
        ({"refresh_open_bucket": "yes"}, "refresh_open_bucket"),
        ({"source": ""}, "source is set"),
    ],
)
def test_malformed_rollup_fields(patch: dict[str, Any], rule: str) -> None:
    rejected(catalog(h={**rollup(), **patch}), "h", rule)


def test_non_positive_period() -> None:
    doc = {"time_range_archives": {"t": {"period": "0s", "columns": {"x": "double"}}}}
    rejected(doc, "t", "period", "positive")


def test_sections_and_bodies_must_be_mappings() -> None:
    rejected({"rollups": ["h"]}, "<memory>", "rollups is a mapping")
    rejected({"raw_archives": {"meter": ["x"]}}, "meter", "archive body is a mapping")


# ---------------------------------------------------------------------------------------------
# Durations (sizes, lags, periods)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("15m", timedelta(minutes=15)),
        (" 5 min ", timedelta(minutes=5)),
        ("1h", timedelta(hours=1)),
        ("2d", timedelta(days=2)),
        ("1w", timedelta(weeks=1)),
        ("500ms", timedelta(milliseconds=500)),
        ("PT15M", timedelta(minutes=15)),
        ("pt1h", timedelta(hours=1)),
        ("P1DT2H30M", timedelta(days=1, hours=2, minutes=30)),
        ("PT0S", timedelta(0)),
        (90, timedelta(seconds=90)),
        (1.5, timedelta(seconds=1.5)),
        (timedelta(hours=3), timedelta(hours=3)),
    ],
)
def test_parse_duration(text: object, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@pytest.mark.parametrize(
    "text", [True, -1, "", "1.5h", "PT", "P", "15 minutes", "-5m", None, "1h30m"]
)
def test_parse_duration_rejects(text: object) -> None:
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


@pytest.mark.parametrize(
    ("value", "text"),
    [(timedelta(0), "0s"), (timedelta(minutes=15), "15m"), (timedelta(hours=2), "2h"),
     (timedelta(days=1), "1d"), (timedelta(seconds=90), "90s"), (timedelta(hours=36), "36h")],
)  # fmt: skip
def test_format_duration_round_trips(value: timedelta, text: str) -> None:
    assert format_duration(value) == text
    assert parse_duration(text) == value


# ---------------------------------------------------------------------------------------------
# File-level failures


def test_bad_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("rollups:\n  h: {source: meter\n")
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == (str(path), "valid YAML")
    assert str(path) in str(info.value) and "[valid YAML]" in str(info.value)


def test_a_key_given_twice_is_rejected_not_dropped(tmp_path: Path) -> None:
    text = DEFAULT_SPECS.read_text(encoding="utf-8")
    duplicate = text + (
        "  energy_daily:\n"
        "    <<: *vienna\n"
        "    source: energy_hourly\n"
        "    alignment: CalendarMonth\n"
    )
    path = tmp_path / "twice.yaml"
    path.write_text(duplicate, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == (str(path), "valid YAML")
    assert "duplicate key 'energy_daily'" in str(info.value)


def test_merge_keys_may_still_be_overridden(tmp_path: Path) -> None:
    text = DEFAULT_SPECS.read_text(encoding="utf-8").replace(
        "    description: Hourly energy per meter\n",
        "    description: Hourly energy per meter\n    watermark_lag: 10m\n",
    )
    path = tmp_path / "override.yaml"
    path.write_text(text, encoding="utf-8")
    cat = load_catalog(path)
    assert cat.rollups["energy_hourly"].watermark_lag == timedelta(minutes=10)
    assert cat.rollups["energy_daily"].watermark_lag == timedelta(minutes=5)


def test_missing_file_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == (str(path), "readable spec file")


def test_a_file_that_is_not_utf8_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("raw_archives:\n  zähler: {columns: {x: double}}\n".encode("latin-1"))
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == (str(path), "readable spec file")
    assert "utf-8" in str(info.value)


def test_top_level_must_be_a_mapping(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- energy_raw\n")
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == (str(path), "top-level mapping")


def test_file_errors_name_the_archive_inside(tmp_path: Path) -> None:
    text = DEFAULT_SPECS.read_text(encoding="utf-8").replace(
        "alignment: Iso8601Week", "alignment: Iso8601Week\n    size: 1h"
    )
    path = tmp_path / "sized.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(SpecError) as info:
        load_catalog(path)
    assert (info.value.archive, info.value.rule) == ("energy_weekly", "size")


def test_a_component_declaration_is_a_spec_file_too() -> None:
    """`ROLLUPS_SPECS` may name a project's `defs.yaml` that declares a RollupChain."""
    path = (
        Path(__file__).resolve().parents[2]
        / "examples/existing_project/existing_project/defs/meters/defs.yaml"
    )
    cat = load_catalog(path)
    assert list(cat.raw) == ["meter_raw"]
    assert list(cat.rollups) == ["meter_hourly", "meter_daily"]
    assert cat.raw["meter_raw"].column("current_a").formula is not None
