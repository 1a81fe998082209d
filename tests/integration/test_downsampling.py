"""Downsampling queries against the pandas oracle: calendar steps in the reference zone across
the Vienna DST switch of March 2025 (a 23-hour day), ISO week 2025-W01 (spanning the year end),
month and year ends; fixed steps; every entity merged (`group_by="all"`), on Arrow and Spark."""

import dataclasses
import shutil
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta

import pandas as pd
import pyarrow as pa
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.errors import (
    InvalidAggregationError,
    InvalidStepError,
    InvalidTimeRangeError,
    InvalidTimeZoneError,
)
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.steps import step_spec
from rollup_assets.model.windows import Window
from rollup_assets.services import downsample, surface_layout
from rollup_assets.services.downsample import downsample_arrow, downsample_spark
from rollup_assets.services.surface import publish
from tests.conftest import World, days, world_of
from tests.oracle import compare, oracle

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
# Year end 2024 (ISO week 2025-W01 spans it), and March 2025 with its 23-hour day (the 30th).
SPANS = [(date(2024, 12, 27), 7), (date(2025, 3, 29), 3)]
METERS = 2


@pytest.fixture(scope="module")
def chain(tmp_path_factory: pytest.TempPathFactory, spark) -> Iterator[World]:
    """Every level backfilled over the sample in one range run (one installation for the module:
    the tests only read)."""
    with pytest.MonkeyPatch.context() as mp:
        for world in world_of(tmp_path_factory.mktemp("downsampling"), mp, load_catalog()):
            world.ops.activate("energy_raw", now=NOW)
            batch = [
                day_batch(d, METERS, seed=5, missing=0.05, null_power=0.1, null_voltage=0.1)
                for first, n in SPANS
                for d in days(first, n)
            ]
            world.ingest(pa.concat_tables(batch), source="Import")
            world.activate_all(NOW)
            world.backfill(
                [Window(datetime(2024, 12, 27, tzinfo=UTC), datetime(2025, 4, 1, tzinfo=UTC))]
            )
            yield world


def expected(world: World, rollup: str, every: str, merged: bool = False) -> pd.DataFrame:
    """The oracle for the steps: raw rows aggregated straight into the step's buckets."""
    raw = world.raw()
    if merged:
        raw = raw.assign(entity_id="*")
    return oracle(raw, step_spec(world.catalog.rollup(rollup), every))


def actual(table: pa.Table, merged: bool = False) -> pa.Table:
    out = table.rename_columns(
        ["bucket_start" if n == "step_start" else n for n in table.column_names]
    )
    if merged:
        assert "entity_id" not in table.column_names
        out = out.append_column("entity_id", pa.array(["*"] * out.num_rows, pa.string()))
    return out


@pytest.mark.parametrize(
    ("rollup", "every"),
    [
        ("energy_hourly", "day"),  # 23 h and 25 h local days
        ("energy_hourly", "3h"),
        ("energy_hourly", "week"),
        ("energy_daily", "week"),  # 2025-W01 spans the year end
        ("energy_daily", "month"),
        ("energy_daily", "year"),
        ("energy_monthly", "year"),
        ("energy_weekly", "week"),
    ],
)
def test_downsampling_equals_the_oracle(chain: World, rollup: str, every: str) -> None:
    step = step_spec(chain.catalog.rollup(rollup), every)
    got = downsample_arrow(chain.engine, rollup, every)
    assert got.column_names[:3] == ["step_start", "step_end", "entity_id"]
    assert compare(actual(got), expected(chain, rollup, every), step) == []


def test_calendar_steps_follow_the_reference_zone(chain: World) -> None:
    got = downsample_arrow(chain.engine, "energy_hourly", "day", entities=["meter-0000"])
    lengths = {
        r["step_start"]: r["step_end"] - r["step_start"]
        for r in got.select(["step_start", "step_end"]).to_pylist()
    }
    assert lengths[datetime(2025, 3, 29, 23, tzinfo=UTC)] == timedelta(hours=23)
    assert lengths[datetime(2025, 3, 28, 23, tzinfo=UTC)] == timedelta(hours=24)
    weeks = downsample_arrow(chain.engine, "energy_daily", "week", entities=["meter-0000"])
    w01 = datetime(2024, 12, 29, 23, tzinfo=UTC)  # Monday 2024-12-30, Vienna
    assert w01 in weeks["step_start"].to_pylist()


def test_every_entity_merged(chain: World) -> None:
    for rollup, every in (("energy_daily", "month"), ("energy_hourly", "day")):
        step = step_spec(chain.catalog.rollup(rollup), every)
        got = downsample_arrow(chain.engine, rollup, every, group_by="all")
        want = expected(chain, rollup, every, merged=True)
        assert len(want) and compare(actual(got, merged=True), want, step) == []


def test_a_range_of_whole_steps(chain: World) -> None:
    # December 2024 and January 2025 in Vienna.
    start, end = datetime(2024, 11, 30, 23, tzinfo=UTC), datetime(2025, 1, 31, 23, tzinfo=UTC)
    got = downsample_arrow(chain.engine, "energy_daily", "month", start, end, ["meter-0001"])
    want = expected(chain, "energy_daily", "month")
    want = want[(want["entity_id"] == "meter-0001") & (want["bucket_start"] < end)]
    step = step_spec(chain.catalog.rollup("energy_daily"), "month")
    assert len(want) == 2 and compare(actual(got), want, step) == []
    with pytest.raises(InvalidTimeRangeError, match="not a boundary of the month steps"):
        downsample_arrow(chain.engine, "energy_daily", "month", datetime(2025, 1, 1, tzinfo=UTC))
    with pytest.raises(InvalidStepError, match=r"energy_monthly.*CalendarMonth.*--every week"):
        downsample_arrow(chain.engine, "energy_monthly", "week")


def test_spark_downsampling_equals_arrow(chain: World, spark) -> None:
    for rollup, every, group_by in (
        ("energy_daily", "month", "entity"),
        ("energy_hourly", "day", "all"),
        ("energy_hourly", "6h", "entity"),
    ):
        arrow = downsample_arrow(chain.engine, rollup, every, group_by=group_by)
        frame = downsample_spark(chain.engine, spark, rollup, every, group_by=group_by)
        got = frame.toArrow()
        assert got.column_names == arrow.column_names
        assert _rows(got) == _rows(arrow)
    bounded = downsample_spark(
        chain.engine,
        spark,
        "energy_daily",
        "year",
        datetime(2024, 12, 31, 23, tzinfo=UTC),
        datetime(2025, 12, 31, 23, tzinfo=UTC),
    ).toArrow()
    assert set(bounded["step_start"].to_pylist()) == {datetime(2024, 12, 31, 23, tzinfo=UTC)}


def test_agg_picks_among_the_rollup_s_aggregations(chain: World, spark) -> None:
    aggs = ["voltage_v:max", "energy_kwh:SUM"]
    picked = downsample_arrow(chain.engine, "energy_daily", "month", aggs=aggs)
    assert picked.column_names == [
        "step_start",
        "step_end",
        "entity_id",
        "voltage_v_max",
        "energy_kwh_sum",
    ]
    step = step_spec(chain.catalog.rollup("energy_daily"), "month")
    step = dataclasses.replace(
        step,
        aggregations=tuple(a for a in step.aggregations if a.output_name in picked.schema.names),
    )
    want = oracle(chain.raw(), step)
    assert len(want) and compare(actual(picked), want, step) == []
    on_spark = downsample_spark(chain.engine, spark, "energy_daily", "month", aggs=aggs)
    got = on_spark.toArrow()
    assert got.column_names == picked.column_names and _rows(got) == _rows(picked)
    # The rollup's own zone may be named; another is refused, as is what it does not keep.
    same = downsample_arrow(chain.engine, "energy_daily", "month", zone="Europe/Vienna")
    assert _rows(same) == _rows(downsample_arrow(chain.engine, "energy_daily", "month"))
    with pytest.raises(InvalidTimeZoneError, match="kept in Europe/Vienna"):
        downsample_arrow(chain.engine, "energy_daily", "month", zone="UTC")
    with pytest.raises(InvalidAggregationError, match=r"keeps no Sum\(power_kw\)"):
        downsample_spark(chain.engine, spark, "energy_daily", "month", aggs=["power_kw:sum"])


def _rows(table: pa.Table) -> list[tuple]:
    out = []
    for r in table.to_pylist():
        out.append(
            tuple(
                round(v, 9)
                if isinstance(v, float)
                else v.astimezone(UTC)
                if isinstance(v, datetime)
                else v
                for v in r.values()
            )
        )
    return out


def test_a_step_spec_keeps_the_rollup_s_columns() -> None:
    spec = load_catalog().rollup("energy_daily")
    step = step_spec(spec, "month")
    assert dataclasses.replace(step, alignment=spec.alignment, source=spec.source) == spec


def test_a_current_surface_is_read_for_every_entity(
    chain: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once published, the surfaces hold each average's sum and count: downsampling every entity
    reads them, never resolving the pointers, and still equals the oracle (an average of the
    step, not of its buckets' averages), in step and entity order although it reads them in the
    surface's file order (here a file per meter and partition)."""
    monkeypatch.setattr(surface_layout, "SURFACE_FILE_ROWS", 16)
    for rollup in chain.catalog.rollups:
        spec = chain.catalog.rollup(rollup)
        shutil.rmtree(chain.engine.rollups.surface_uri(spec), ignore_errors=True)  # built anew
        publish(chain.engine, spec)

    def resolved(*args: object, **kwargs: object) -> pa.Table:
        raise AssertionError("the pointers were resolved while the surface was current")

    monkeypatch.setattr(downsample, "stored_partials", resolved)
    for rollup, every in (
        ("energy_daily", "month"),
        ("energy_hourly", "day"),
        ("energy_hourly", "3h"),
    ):
        step = step_spec(chain.catalog.rollup(rollup), every)
        got = downsample_arrow(chain.engine, rollup, every)
        assert compare(actual(got), expected(chain, rollup, every), step) == []
        keys = list(zip(got["step_start"].to_pylist(), got["entity_id"].to_pylist(), strict=True))
        assert keys == sorted(keys), f"{rollup} by {every}: not in step and entity order"
        merged = downsample_arrow(chain.engine, rollup, every, group_by="all")
        want = expected(chain, rollup, every, merged=True)
        assert compare(actual(merged, merged=True), want, step) == []
    # A read of named entities resolves the pointers (the row table is ordered by entity).
    with pytest.raises(AssertionError, match="pointers were resolved"):
        downsample_arrow(chain.engine, "energy_daily", "month", entities=["meter-0001"])
