"""The independent check: every rollup level computed straight from raw rows with pandas.

Used by the tests, `rollups verify` and the demo. Buckets are derived with pandas' own time-zone
handling (local day, ISO week, month, year in the reference zone), not with the project's bucket
code, so the two can disagree if either is wrong. Everything is loaded into memory: this is a check
for test-sized and demo-sized archives, not for production volumes (use `rollups check` there).

A raw row belongs to the bucket holding its `ts`; a time-range row `[range_start, range_end)` to
the bucket holding its `range_start`, and the whole range must lie in that bucket (`split_rows`
lists the rows that do not: a rollup over them would be wrong whatever it computed).
"""

import numpy as np
import pandas as pd
import pyarrow as pa

from rollup_assets.model.specs import AggregateFunction, Alignment, Catalog, RollupSpec

TIME_COLUMNS = ("ts", "range_start")  # a raw row's time, a time-range row's start


def _local_starts(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """Naive local start of each calendar bucket (not for FixedSize)."""
    local = ts_utc.dt.tz_convert(spec.reference_time_zone)
    day = local.dt.tz_localize(None).dt.normalize()
    if spec.alignment is Alignment.ISO8601_WEEK:
        day = day - pd.to_timedelta(day.dt.dayofweek, unit="D")
    elif spec.alignment is Alignment.CALENDAR_MONTH:
        day = day.dt.to_period("M").dt.to_timestamp()
    elif spec.alignment is Alignment.CALENDAR_YEAR:
        day = day.dt.to_period("Y").dt.to_timestamp()
    return day


def bucket_starts(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """UTC start of each timestamp's bucket, via local calendar arithmetic in pandas."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return ts_utc.dt.floor(pd.Timedelta(spec.size))
    day = _local_starts(ts_utc, spec)
    return day.dt.tz_localize(spec.reference_time_zone).dt.tz_convert("UTC")


def bucket_ends(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """UTC end of each timestamp's bucket: the next local calendar boundary, or start + size."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return ts_utc.dt.floor(pd.Timedelta(spec.size)) + pd.Timedelta(spec.size)
    step = {
        Alignment.CALENDAR_DAY: pd.DateOffset(days=1),
        Alignment.ISO8601_WEEK: pd.DateOffset(weeks=1),
        Alignment.CALENDAR_MONTH: pd.DateOffset(months=1),
        Alignment.CALENDAR_YEAR: pd.DateOffset(years=1),
    }[spec.alignment]
    nxt = _local_starts(ts_utc, spec) + step
    return nxt.dt.tz_localize(spec.reference_time_zone).dt.tz_convert("UTC")


def time_column(raw: pd.DataFrame) -> str:
    """The column whose instant places a row in its bucket (`ts`, or `range_start`)."""
    return next(c for c in TIME_COLUMNS if c in raw.columns)


def split_rows(raw: pd.DataFrame, spec: RollupSpec) -> pd.DataFrame:
    """The time-range rows of `raw` whose range ends after the end of the bucket `spec` puts
    them in (empty for raw rows, which have no range)."""
    if "range_end" not in raw.columns or raw.empty:
        return raw.iloc[0:0]
    start = pd.to_datetime(raw["range_start"], utc=True)
    end = pd.to_datetime(raw["range_end"], utc=True)
    return raw[(end > bucket_ends(start, spec)).to_numpy()]


def oracle(raw: pd.DataFrame, spec: RollupSpec) -> pd.DataFrame:
    """Logical columns of `spec` for every (entity, bucket) that has raw rows (time-range rows
    by their `range_start`)."""
    df = raw.copy()
    time_col = time_column(df)
    df[time_col] = pd.to_datetime(df[time_col], utc=True)
    df["bucket_start"] = bucket_starts(df[time_col], spec)
    g = df.groupby(["entity_id", "bucket_start"])
    out = pd.DataFrame(index=g.size().index)
    for agg in spec.aggregations:
        col = g[agg.column]
        fn = agg.function
        if fn is AggregateFunction.SUM:
            s = col.sum(min_count=1)
        elif fn is AggregateFunction.COUNT:
            s = col.count()
        elif fn is AggregateFunction.AVG:
            s = col.mean()
        elif fn is AggregateFunction.MIN:
            s = col.min()
        else:
            s = col.max()
        out[agg.output_name] = s
    return out.reset_index().sort_values(["bucket_start", "entity_id"]).reset_index(drop=True)


def raw_frame(table: pa.Table) -> pd.DataFrame:
    """The rows of a raw or time-range archive, their instants as UTC timestamps."""
    df = table.to_pandas()
    for c in (*TIME_COLUMNS, "range_end"):
        if c in df.columns:
            df[c] = pd.to_datetime(df[c], utc=True)
    return df


def compare(
    actual: pa.Table, expected: pd.DataFrame, spec: RollupSpec, rel: float = 1e-9
) -> list[str]:
    """Differences between a queried rollup and the oracle (empty list: equal)."""
    act = actual.to_pandas()
    act["bucket_start"] = pd.to_datetime(act["bucket_start"], utc=True)
    a = act.set_index(["entity_id", "bucket_start"])
    e = expected.set_index(["entity_id", "bucket_start"])
    problems = []
    missing = e.index.difference(a.index)
    extra = a.index.difference(e.index)
    if len(missing):
        problems.append(
            f"{spec.name}: {len(missing)} expected row(s) missing, e.g. {list(missing[:3])}"
        )
    if len(extra):
        problems.append(f"{spec.name}: {len(extra)} unexpected row(s), e.g. {list(extra[:3])}")
    joined = e.join(a, how="inner", lsuffix="__e", rsuffix="__a")
    for name in spec.output_names:
        x = pd.to_numeric(joined[f"{name}__a"], errors="coerce").astype(float)
        y = pd.to_numeric(joined[f"{name}__e"], errors="coerce").astype(float)
        both_null = x.isna() & y.isna()
        close = np.isclose(x.to_numpy(), y.to_numpy(), rtol=rel, atol=1e-9)
        bad = joined.index[~(both_null.to_numpy() | close)]
        if len(bad):
            k = bad[0]
            problems.append(
                f"{spec.name} {name}: {len(bad)} value(s) differ, "
                f"e.g. {k}: got {x[k]}, expected {y[k]}"
            )
    return problems


def compare_all(
    query,
    raw: pd.DataFrame,
    catalog: Catalog,
    only_before: dict | None = None,
    names: list[str] | None = None,
) -> list[str]:
    """Compare every rollup (or `names`), optionally only buckets starting before a per-rollup
    instant. `query(name)` returns the rollup's rows as Arrow."""
    problems = []
    for spec in catalog.rollups.values():
        if names is not None and spec.name not in names:
            continue
        split = split_rows(raw, spec)
        if len(split):
            r = split.iloc[0]
            problems.append(
                f"{spec.name}: {len(split)} source row(s) span more than one bucket, e.g. "
                f"{r['entity_id']} [{r['range_start']}, {r['range_end']})"
            )
        expected = oracle(raw, spec)
        actual = query(spec.name)
        if only_before and spec.name in only_before:
            cut = pd.Timestamp(only_before[spec.name])
            expected = expected[expected["bucket_start"] < cut]
            mask = pa.compute.less(
                actual["bucket_start"],
                pa.scalar(only_before[spec.name], actual.schema.field("bucket_start").type),
            )
            actual = actual.filter(mask)
        problems += compare(actual, expected, spec)
    return problems
