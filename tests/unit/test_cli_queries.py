"""`rollups query ARCHIVE --every STEP --agg COLUMN:FUNCTION` over raw and time-range archives,
through click's runner on a fresh warehouse (no Spark: the ranges are small), against the pandas
oracle (`tests.query_oracle`). The refusals are in `test_cli.BAD`."""

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from rollup_assets.demo.sample_data import day_batch
from tests.query_oracle import expected_steps
from tests.unit.test_cli import Invoke, as_json, assert_one_line_failure, rollups  # noqa: F401

VIENNA = "Europe/Vienna"
DAYS = [date(2025, 3, 29), date(2025, 3, 30), date(2025, 10, 25), date(2025, 10, 26)]


def loaded(invoke: Invoke, tmp_path: Path) -> pa.Table:
    """energy_raw activated, holding two meters' readings of the DST days; its stored rows."""
    readings = pa.concat_tables([day_batch(d, 2, seed=9, null_voltage=0.2) for d in DAYS])
    path = tmp_path / "readings.parquet"
    pq.write_table(readings, path)
    as_json(invoke("activate", "energy_raw", "--format", "json"))
    as_json(invoke("ingest", "energy_raw", path, "--format", "json"))
    return DeltaTable(str(tmp_path / "warehouse" / "raw" / "energy_raw")).to_pyarrow_table()


def agg_options(aggs: list[tuple[str, str]], upper: bool = False) -> list[str]:
    """`--agg COLUMN:FUNCTION` for each aggregation (the function in upper case: any case is
    accepted)."""
    return [a for c, f in aggs for a in ("--agg", f"{c}:{f.upper() if upper else f}")]


def as_expected(rows: list[dict]) -> dict[tuple, dict]:
    """JSON rows in the oracle's shape (instants parsed back)."""
    out = {}
    for r in rows:
        start = datetime.fromisoformat(r.pop("step_start").replace("Z", "+00:00"))
        r["step_end"] = datetime.fromisoformat(r["step_end"].replace("Z", "+00:00"))
        out[(start, r.pop("entity_id", None))] = r
    return out


def same(got: dict[tuple, dict], want: dict[tuple, dict]) -> bool:
    if got.keys() != want.keys():
        return False
    for key, row in want.items():
        for name, value in row.items():
            have = got[key][name]
            if isinstance(value, float):
                if have is None or abs(have - value) > 1e-9 * max(1.0, abs(value)):
                    return False
            elif have != value:
                return False
    return True


def test_a_raw_archive_by_vienna_days(rollups: Invoke, tmp_path: Path) -> None:  # noqa: F811
    stored = loaded(rollups, tmp_path)
    aggs = [
        ("energy_kwh", "sum"),
        ("voltage_v", "max"),
        ("power_kw", "avg"),
        ("voltage_v", "count"),
    ]
    args = ["query", "energy_raw", "--every", "day", "--zone", VIENNA, *agg_options(aggs)]
    res = rollups(*args, "--format", "json")
    got = as_expected(as_json(res))
    want = expected_steps(stored, "ts", "day", VIENNA, aggs)
    assert len(want) == 2 * 6 and same(got, want)  # 4 UTC days touch 6 Vienna days
    lengths = {k[0]: v["step_end"] - k[0] for k, v in got.items()}
    assert lengths[datetime(2025, 3, 29, 23, tzinfo=UTC)] == timedelta(hours=23)
    assert lengths[datetime(2025, 10, 25, 22, tzinfo=UTC)] == timedelta(hours=25)
    # Which engine aggregated, and why, goes to stderr (stdout stays the data).
    assert res.stderr.startswith("note: 'energy_raw': aggregated with Arrow on the driver")
    table = rollups(*args)
    assert table.exit_code == 0
    assert table.stdout.split()[:4] == ["step_start", "step_end", "entity_id", "energy_kwh_sum"]
    csv = rollups(*args, "--format", "csv")
    assert csv.stdout.splitlines()[0] == (
        "step_start,step_end,entity_id,energy_kwh_sum,voltage_v_max,power_kw_avg,voltage_v_count"
    )


def test_a_raw_archive_over_all_meters_by_fixed_steps(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
) -> None:
    stored = loaded(rollups, tmp_path)
    aggs = [("energy_kwh", "sum"), ("voltage_v", "min"), ("energy_kwh", "count")]
    first, last = "2025-03-30T00:00:00Z", "2025-03-31T00:00:00Z"
    args = ["query", "energy_raw", "--every", "6h", "--group-by", "all", "--from", first]
    args += ["--to", last, *agg_options(aggs, upper=True), "--format", "json"]
    got = as_expected(as_json(rollups(*args)))
    day = (datetime(2025, 3, 30, tzinfo=UTC), datetime(2025, 3, 31, tzinfo=UTC))
    within = stored.filter(
        pc.and_(pc.greater_equal(stored["ts"], day[0]), pc.less(stored["ts"], day[1]))
    )
    want = expected_steps(within, "ts", pd.Timedelta(hours=6), "UTC", aggs, group_by="all")
    assert len(want) == 4 and same(got, want)
    misaligned = ["--agg", "energy_kwh:sum", "--from", "2025-03-30T01:00:00Z"]
    assert_one_line_failure(
        rollups("query", "energy_raw", "--every", "6h", *misaligned),
        "--from 2025-03-30T01:00:00Z is not a boundary of the 6h steps of 'energy_raw'",
    )


def test_a_time_range_archive(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    specs = tmp_path / "ranges.yaml"
    specs.write_text(
        yaml.safe_dump(
            {
                "time_range_archives": {
                    "tariffs": {
                        "period": "1h",
                        "columns": {
                            "price": {"type": "double", "required": True},
                            "zone_code": "string",
                        },
                    }
                }
            }
        )
    )
    monkeypatch.setenv("ROLLUPS_SPECS", str(specs))
    hours = [datetime(2025, 10, 25, 20, tzinfo=UTC) + timedelta(hours=h) for h in range(30)]
    batch = pa.table(
        {
            "entity_id": ["grid"] * len(hours),
            "range_start": pa.array(hours, pa.timestamp("us", tz="UTC")),
            "range_end": pa.array(
                [h + timedelta(hours=1) for h in hours], pa.timestamp("us", tz="UTC")
            ),
            "price": [float(i % 7) for i in range(len(hours))],
            "zone_code": [None if i % 5 == 0 else "AT" for i in range(len(hours))],
        }
    )
    path = tmp_path / "tariffs.parquet"
    pq.write_table(batch, path)
    as_json(rollups("activate", "tariffs", "--format", "json"))
    as_json(rollups("ingest", "tariffs", path, "--format", "json"))
    aggs = [("price", "avg"), ("price", "max"), ("zone_code", "count")]
    args = ["query", "tariffs", "--every", "day", "--zone", VIENNA, *agg_options(aggs)]
    got = as_expected(as_json(rollups(*args, "--format", "json")))
    assert same(got, expected_steps(batch, "range_start", "day", VIENNA, aggs))
    autumn = got[(datetime(2025, 10, 25, 22, tzinfo=UTC), "grid")]
    assert autumn["zone_code_count"] == 25 - 5  # 25 hourly ranges, every fifth code null
    assert_one_line_failure(
        rollups("query", "tariffs", "--every", "day", "--agg", "zone_code:avg"),
        "Avg(zone_code) needs a numeric column; 'zone_code' is string",
    )
    assert_one_line_failure(
        rollups("query", "tariffs", "--every", "30m", "--agg", "price:sum"),
        "cannot downsample 'tariffs' (period 1h) by --every 30m",
    )
