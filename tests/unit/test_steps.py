"""Downsampling steps: which steps nest a rollup's buckets, and the whole-step range rule."""

from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.errors import InvalidStepError, InvalidTimeRangeError
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Alignment
from rollup_assets.model.steps import check_step_range, describe_step, step_spec

CATALOG = load_catalog()


@pytest.mark.parametrize(
    ("rollup", "every", "alignment", "size"),
    [
        ("energy_hourly", "1h", Alignment.FIXED_SIZE, timedelta(hours=1)),
        ("energy_hourly", "3h", Alignment.FIXED_SIZE, timedelta(hours=3)),
        ("energy_hourly", "PT6H", Alignment.FIXED_SIZE, timedelta(hours=6)),
        ("energy_hourly", "day", Alignment.CALENDAR_DAY, None),
        ("energy_hourly", "Week", Alignment.ISO8601_WEEK, None),
        ("energy_hourly", "year", Alignment.CALENDAR_YEAR, None),
        ("energy_daily", "day", Alignment.CALENDAR_DAY, None),
        ("energy_daily", "week", Alignment.ISO8601_WEEK, None),
        ("energy_daily", "month", Alignment.CALENDAR_MONTH, None),
        ("energy_weekly", "week", Alignment.ISO8601_WEEK, None),
        ("energy_monthly", "year", Alignment.CALENDAR_YEAR, None),
        ("energy_yearly", "year", Alignment.CALENDAR_YEAR, None),
    ],
)
def test_steps_that_nest(rollup: str, every: str, alignment: Alignment, size) -> None:
    spec = CATALOG.rollup(rollup)
    step = step_spec(spec, every)
    assert (step.alignment, step.size) == (alignment, size)
    assert step.reference_time_zone == spec.reference_time_zone
    assert step.stored_columns == spec.stored_columns


@pytest.mark.parametrize(
    ("rollup", "every", "why"),
    [
        ("energy_hourly", "90m", "not an integer multiple"),
        ("energy_hourly", "30m", "finer than"),
        ("energy_daily", "24h", "whose length varies"),
        ("energy_daily", "1d", "whose length varies"),
        ("energy_monthly", "week", "finer than"),
        ("energy_monthly", "day", "finer than"),
        ("energy_weekly", "month", "straddle month"),
        ("energy_weekly", "year", "straddle month"),
        ("energy_weekly", "day", "finer than"),
        ("energy_yearly", "month", "finer than"),
    ],
)
def test_steps_that_do_not_nest_are_refused(rollup: str, every: str, why: str) -> None:
    spec = CATALOG.rollup(rollup)
    with pytest.raises(InvalidStepError) as err:
        step_spec(spec, every)
    text = str(err.value)
    assert f"'{rollup}'" in text and spec.alignment.value in text and why in text
    assert f"--every {every.lower() if every.isalpha() else describe_step_of(every)}" in text


def describe_step_of(every: str) -> str:
    return {"90m": "90m", "30m": "30m", "24h": "1d", "1d": "1d"}[every]


@pytest.mark.parametrize("every", ["fortnight", "", "-1h", "0s", "1.5h"])
def test_unparseable_or_empty_steps_are_refused(every: str) -> None:
    with pytest.raises(InvalidStepError, match="energy_hourly"):
        step_spec(CATALOG.rollup("energy_hourly"), every)


def test_a_query_range_must_be_whole_steps() -> None:
    spec = CATALOG.rollup("energy_hourly")
    day = step_spec(spec, "day")
    # Vienna midnight on the 23-hour day of 2025-03-30: 2025-03-29T23:00Z.
    start, end = datetime(2025, 3, 29, 23, tzinfo=UTC), datetime(2025, 3, 30, 22, tzinfo=UTC)
    check_step_range(spec, day, start, end)
    check_step_range(spec, day, None, None)
    assert Bucketing.of(day).next_start(start) - start == timedelta(hours=23)
    with pytest.raises(InvalidTimeRangeError) as err:
        check_step_range(spec, day, datetime(2025, 3, 30, 0, tzinfo=UTC), end)
    text = str(err.value)
    assert "--from 2025-03-30T00:00:00Z" in text
    assert "2025-03-29T23:00:00Z and 2025-03-30T22:00:00Z" in text
    month = step_spec(CATALOG.rollup("energy_daily"), "month")
    with pytest.raises(InvalidTimeRangeError, match="--to"):
        check_step_range(spec, month, None, datetime(2025, 2, 1, tzinfo=UTC))
    check_step_range(spec, month, None, datetime(2025, 1, 31, 23, tzinfo=UTC))
    assert describe_step(month) == "month" and describe_step(step_spec(spec, "180m")) == "3h"


def test_a_duration_step_counts_from_the_rollups_origin() -> None:
    """Over 90-minute buckets from 00:30 UTC, a 3-hour step starts at 00:30, 03:30, ...: whole
    pairs of the rollup's buckets, never a bucket cut in two."""
    doc = {
        "raw_archives": {"r": {"columns": {"x": "double"}}},
        "rollups": {
            "q": {
                "source": "r",
                "alignment": "FixedSize",
                "size": "90m",
                "origin": "2025-01-01T00:30:00Z",
                "reference_time_zone": "Europe/Vienna",
                "start": "2025-01-01",
                "aggregations": [{"column": "x", "function": "Sum"}],
            }
        },
    }
    spec = parse_catalog(doc).rollup("q")
    step = step_spec(spec, "3h")
    assert step.origin == spec.origin == datetime(2025, 1, 1, 0, 30, tzinfo=UTC)
    t = datetime(2025, 6, 1, 2, 0, tzinfo=UTC)
    assert Bucketing.of(step).window_of(t).start == datetime(2025, 6, 1, 0, 30, tzinfo=UTC)
    check_step_range(spec, step, datetime(2025, 6, 1, 3, 30, tzinfo=UTC), None)
    with pytest.raises(InvalidTimeRangeError, match="2025-06-01T00:30:00Z and"):
        check_step_range(spec, step, datetime(2025, 6, 1, 3, tzinfo=UTC), None)
    with pytest.raises(InvalidStepError, match="not an integer multiple"):
        step_spec(spec, "2h")
