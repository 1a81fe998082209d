"""The oracle of downsampling queries over raw and time-range archives: pandas on the rows, with
pandas' own time-zone handling (tz_convert, normalize, DateOffset), sharing no code with the
bucketing or the aggregation it checks.

Values follow SQL and Spark: nulls are ignored, Count counts non-null values (NaN included), a
Sum, Min, Max or Avg of no value is null; NaN is above every number (a Sum, Avg or Max over a NaN
is NaN, a Min skips NaN unless every value is NaN). Null and NaN are told apart from the Arrow
rows before pandas (which reads both as missing) sees them.
"""

import math
from datetime import UTC, datetime

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

CALENDAR = {
    "day": pd.DateOffset(days=1),
    "week": pd.DateOffset(weeks=1),
    "month": pd.DateOffset(months=1),
    "year": pd.DateOffset(years=1),
}


def step_bounds(t: pd.Series, every: str | pd.Timedelta, zone: str) -> tuple[pd.Series, pd.Series]:
    """UTC start and end of the step holding each UTC instant of `t`: calendar steps from the
    local date in `zone`, durations floored from the Unix epoch in UTC."""
    if not isinstance(every, str):
        start = t.dt.floor(every)
        return start, start + every
    local = t.dt.tz_convert(zone).dt.tz_localize(None).dt.normalize()
    if every == "week":
        local = local - pd.to_timedelta(local.dt.dayofweek, unit="D")
    elif every == "month":
        local = local.dt.to_period("M").dt.to_timestamp()
    elif every == "year":
        local = local.dt.to_period("Y").dt.to_timestamp()
    start = local.dt.tz_localize(zone).dt.tz_convert("UTC")
    end = (local + CALENDAR[every]).dt.tz_localize(zone).dt.tz_convert("UTC")
    return start, end


def expected_steps(
    rows: pa.Table,
    time_column: str,
    every: str | pd.Timedelta,
    zone: str,
    aggs: list[tuple[str, str]],
    group_by: str = "entity",
) -> dict[tuple, dict]:
    """(step_start, entity_id or None) -> {"step_end": ..., "<column>_<function>": value} for
    every step (and entity) with rows; None for null, NaN for NaN."""
    df = pd.DataFrame({"t": pd.to_datetime(rows[time_column].to_pandas(), utc=True)})
    df["entity_id"] = rows["entity_id"].to_pandas() if group_by == "entity" else "*"
    df["step_start"], df["step_end"] = step_bounds(df["t"], every, zone)
    for column in {c for c, _ in aggs}:
        values = rows[column]
        floating = pa.types.is_floating(values.type)
        df[f"{column}__valid"] = pc.is_valid(values).to_numpy(zero_copy_only=False)
        nan = pc.fill_null(pc.is_nan(values), False) if floating else pa.array([False] * len(df))
        df[f"{column}__nan"] = nan.to_numpy(zero_copy_only=False)
        number = df[f"{column}__valid"] & ~df[f"{column}__nan"]
        numeric = pa.types.is_integer(values.type) or floating
        df[f"{column}__num"] = (
            pd.Series(values.to_pandas(), dtype="float64").where(number) if numeric else None
        )
    out: dict[tuple, dict] = {}
    for (start, entity), g in df.groupby(["step_start", "entity_id"]):
        row: dict = {"step_end": g["step_end"].iloc[0].to_pydatetime()}
        for column, function in aggs:
            row[f"{column}_{function}".lower()] = _value(g, column, function.lower())
        key = (start.to_pydatetime(), None if group_by == "all" else entity)
        out[key] = row
    return out


def _value(g: pd.DataFrame, column: str, function: str) -> object:
    count = int(g[f"{column}__valid"].sum())
    if function == "count":
        return count
    if count == 0:
        return None
    any_nan = bool(g[f"{column}__nan"].any())
    numbers = g[f"{column}__num"].dropna()
    if function == "min":
        return float("nan") if numbers.empty else numbers.min()
    if any_nan:
        return float("nan")
    if function == "max":
        return numbers.max()
    total = numbers.sum()
    return total if function == "sum" else total / count


def actual_steps(table: pa.Table) -> dict[tuple, dict]:
    """A query's output in the oracle's shape."""
    out: dict[tuple, dict] = {}
    for r in table.to_pylist():
        start = r.pop("step_start").astimezone(UTC)
        entity = r.pop("entity_id", None)
        r["step_end"] = r["step_end"].astimezone(UTC)
        out[(start, entity)] = r
    return out


def differences(actual: pa.Table, expected: dict[tuple, dict], rel: float = 1e-9) -> list[str]:
    """What differs between a query's output and the oracle (empty: equal). Counts and step
    bounds exactly, sums up to rounding; null is not NaN."""
    got = actual_steps(actual)
    problems = [f"missing {k}" for k in sorted(expected.keys() - got.keys(), key=str)]
    problems += [f"unexpected {k}" for k in sorted(got.keys() - expected.keys(), key=str)]
    for key in sorted(expected.keys() & got.keys(), key=str):
        want, have = expected[key], got[key]
        if set(want) != set(have):
            problems.append(f"{key}: columns {sorted(have)} instead of {sorted(want)}")
            continue
        for name, w in want.items():
            if not _same(have[name], w, rel):
                problems.append(f"{key} {name}: got {have[name]!r}, expected {w!r}")
    return problems


def _same(a: object, b: object, rel: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, datetime) or isinstance(b, datetime):
        return a == b
    if isinstance(b, int):  # a count: exactly, and an integer
        return type(a) is int and a == b
    x, y = float(a), float(b)  # type: ignore[arg-type]
    if math.isnan(x) or math.isnan(y):
        return math.isnan(x) and math.isnan(y)
    return math.isclose(x, y, rel_tol=rel, abs_tol=1e-9)
