"""Downsampling queries over raw and time-range archives on Spark: each form forced on Spark and
on Arrow gives the same rows (NaN and null included), equal to the pandas oracle; `downsample`
and `rollups query` take Spark when the range's files hold more rows than the driver takes."""

import json
import math
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from rollup_assets.cli import app as cli
from rollup_assets.cli import main
from rollup_assets.services import downsample as downsampling
from rollup_assets.services.downsample import downsample, downsample_arrow, downsample_spark
from rollup_assets.services.engine import Engine
from tests.query_oracle import actual_steps, differences, expected_steps
from tests.raw_query_data import (
    RANGE_AGGS,
    RAW_AGGS,
    VIENNA,
    build_engine,
    catalog_doc,
    rows_of,
    specs,
)

FORMS = [
    # archive, every, the oracle's step, zone, group_by, aggregations
    ("energy_raw", "day", "day", VIENNA, "entity", RAW_AGGS),  # 23 h and 25 h days
    ("energy_raw", "week", "week", VIENNA, "all", RAW_AGGS),  # 2025-W01 spans the year end
    ("energy_raw", "1h", pd.Timedelta(hours=1), None, "entity", RAW_AGGS),  # NaN and null hours
    ("energy_raw", "6h", pd.Timedelta(hours=6), None, "all", RAW_AGGS),
    ("energy_raw", "year", "year", "America/New_York", "entity", RAW_AGGS),
    ("meter_ranges", "day", "day", VIENNA, "entity", RANGE_AGGS),
    ("meter_ranges", "15m", pd.Timedelta(minutes=15), None, "all", RANGE_AGGS),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return build_engine(tmp_path_factory.mktemp("raw_queries_spark"))


@pytest.mark.parametrize(("archive", "every", "oracle_step", "zone", "group_by", "aggs"), FORMS)
def test_spark_and_arrow_give_the_oracle(
    engine: Engine, spark, archive: str, every: str, oracle_step, zone, group_by: str, aggs
) -> None:
    kwargs = {"group_by": group_by, "aggs": specs(aggs), "zone": zone}
    on_spark = downsample_spark(engine, spark, archive, every, **kwargs).toArrow()
    on_arrow = downsample_arrow(engine, archive, every, **kwargs)
    assert on_spark.column_names == on_arrow.column_names
    assert [f.type for f in on_spark.schema] == [f.type for f in on_arrow.schema]
    # The same rows in the same order; sums may differ by summation order only.
    keys = ["step_start", *(["entity_id"] if group_by == "entity" else [])]
    assert on_spark.select(keys).equals(on_arrow.select(keys))
    assert differences(on_spark, actual_steps(on_arrow)) == []
    time_column = "ts" if archive == "energy_raw" else "range_start"
    want = expected_steps(
        rows_of(engine, archive), time_column, oracle_step, zone or "UTC", aggs, group_by
    )
    assert len(want) and differences(on_spark, want) == []


def test_spark_reads_a_range_of_whole_steps_for_named_entities(engine: Engine, spark) -> None:
    start, end = datetime(2025, 3, 29, 23, tzinfo=UTC), datetime(2025, 3, 31, 22, tzinfo=UTC)
    kwargs = {"aggs": specs(RAW_AGGS), "zone": VIENNA}
    args = ("energy_raw", "day", start, end, ["meter-0000", "meter-0002"])
    on_spark = downsample_spark(engine, spark, *args, **kwargs).toArrow()
    assert on_spark.num_rows == 2 * 2
    assert differences(on_spark, actual_steps(downsample_arrow(engine, *args, **kwargs))) == []
    empty = downsample_spark(
        engine, spark, "energy_raw", "day", aggs=["energy_kwh:sum"], entities=["nobody"]
    ).toArrow()
    assert empty.num_rows == 0
    assert empty.column_names == ["step_start", "step_end", "entity_id", "energy_kwh_sum"]


def test_downsample_takes_spark_past_the_driver_threshold(
    engine: Engine, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    aggs = specs(RAW_AGGS)
    monkeypatch.setattr(downsampling, "QUERY_DRIVER_ROWS", 1000)
    large = downsample(engine, "energy_raw", "day", aggs=aggs, zone=VIENNA, spark=lambda: spark)
    assert large.computed_with == "spark"
    assert large.note is not None and "aggregated on Spark" in large.note
    assert "(the driver takes at most 1,000)" in large.note
    want = downsample_arrow(engine, "energy_raw", "day", aggs=aggs, zone=VIENNA)
    assert differences(large.table, actual_steps(want)) == []


def test_the_command_says_which_engine_aggregated(
    engine: Engine, spark, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    del spark  # started: the command attaches to the process's session
    specs_file = tmp_path / "specs.yaml"
    specs_file.write_text(yaml.safe_dump(catalog_doc()))
    monkeypatch.setenv("ROLLUPS_SPECS", str(specs_file))
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", engine.warehouse.root)
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path))
    args = ["query", "meter_ranges", "--every", "day", "--zone", VIENNA, "--format", "json"]
    args += [a for spec in specs(RANGE_AGGS) for a in ("--agg", spec)]
    out = {}
    for threshold in (10**9, 0):
        for cached in (cli.settings, cli.catalog, cli.engine):
            cached.cache_clear()
        monkeypatch.setattr(downsampling, "QUERY_DRIVER_ROWS", threshold)
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 0, res.output
        out[threshold] = (json.loads(res.stdout), res.stderr)
    for cached in (cli.settings, cli.catalog, cli.engine):
        cached.cache_clear()
    (on_arrow, arrow_note), (on_spark, spark_note) = out[10**9], out[0]
    assert arrow_note.startswith("note: 'meter_ranges': aggregated with Arrow on the driver")
    assert spark_note.startswith("note: 'meter_ranges': aggregated on Spark")
    assert len(on_arrow) == len(on_spark) > 0
    for a, s in zip(on_arrow, on_spark, strict=True):
        assert a.keys() == s.keys() and a["step_start"] == s["step_start"]
        for k, v in a.items():
            close = isinstance(v, float) and isinstance(s[k], float)
            assert v == s[k] or (close and math.isclose(v, s[k], rel_tol=1e-12)), (k, a, s)
