"""The independent check: every rollup level computed straight from raw rows with pandas.

Used by the tests, `rollups verify` and the demo. Buckets are derived with pandas' own time-zone
handling (local day, ISO week, month, year in the reference zone), not with the project's bucket
code, so the two can disagree if either is wrong. Everything is loaded into memory: this is a check
for test-sized and demo-sized archives, not for production volumes (use `rollups check` there).

A raw row belongs to the bucket holding its `ts`; a time-range row `[range_start, range_end)` to
the bucket holding its `range_start`, and the whole range must lie in that bucket (`split_rows`
lists the rows that do not: a rollup over them would be wrong whatever it computed).
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa

from rollup_assets.model.aggregates import AggregateFunction
from rollup_assets.model.column_types import ColumnType
from rollup_assets.model.formulas import Binary, Call, ColumnRef, Node, Number, Unary
from rollup_assets.model.specs import (
    Alignment,
    Catalog,
    RawArchiveSpec,
    RollupSpec,
    TimeRangeArchiveSpec,
)
from rollup_assets.model.windows import Window

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


def _fixed_starts(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """UTC start of each timestamp's FixedSize bucket: whole sizes from the spec's origin, by
    pandas' floor division of durations (the zone plays no part)."""
    origin = pd.Timestamp(spec.origin).tz_convert("UTC")
    size = pd.Timedelta(spec.size)
    return origin + (ts_utc - origin) // size * size


def bucket_starts(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """UTC start of each timestamp's bucket, via local calendar arithmetic in pandas."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return _fixed_starts(ts_utc, spec)
    day = _local_starts(ts_utc, spec)
    return day.dt.tz_localize(spec.reference_time_zone).dt.tz_convert("UTC")


def bucket_ends(ts_utc: pd.Series, spec: RollupSpec) -> pd.Series:
    """UTC end of each timestamp's bucket: the next local calendar boundary, or start + size."""
    if spec.alignment is Alignment.FIXED_SIZE:
        return _fixed_starts(ts_utc, spec) + pd.Timedelta(spec.size)
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


def raw_frame(
    table: pa.Table, spec: RawArchiveSpec | TimeRangeArchiveSpec | None = None
) -> pd.DataFrame:
    """The rows of a raw or time-range archive, their instants as UTC timestamps; with `spec`,
    its computed columns evaluated again from the inputs with numpy (not with the ingest's Arrow
    evaluator), so a wrong stored value shows."""
    df = table.to_pandas()
    for t in (*TIME_COLUMNS, "range_end"):
        if t in df.columns:
            df[t] = pd.to_datetime(df[t], utc=True)
    for c in spec.computed_columns if spec is not None else ():
        assert c.formula is not None
        with np.errstate(all="ignore"):
            value = _numpy_value(c.formula.tree, df)
        df[c.name] = _as_type(value, c.type, df.index)
    return df


def _numpy_value(node: Node, df: pd.DataFrame) -> np.ndarray:
    """A formula over the frame's columns as float64, NaN for null (see compute/formulas.py)."""

    def clean(x: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(x), x, np.nan)

    def null_if_any(result: np.ndarray, *xs: np.ndarray) -> np.ndarray:
        return np.where(np.any([np.isnan(x) for x in xs], axis=0), np.nan, result)

    match node:
        case Number(value):
            return np.full(len(df), value, dtype=float)
        case ColumnRef(name):
            col = df[name]
            if pd.api.types.is_datetime64_any_dtype(col):
                epoch = pd.Timestamp(0, tz=col.dt.tz)
                ms = (col - epoch) / pd.Timedelta(milliseconds=1)  # whatever the unit
                return ms.astype(float).to_numpy()
            return pd.to_numeric(col, errors="coerce").astype(float).to_numpy()
        case Unary("-", operand):
            return -_numpy_value(operand, df)
        case Unary(_, operand):
            x = _numpy_value(operand, df)
            return null_if_any((x == 0).astype(float), x)
        case Binary(op, left, right):
            a, b = _numpy_value(left, df), _numpy_value(right, df)
            arithmetic = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.divide}
            if op in arithmetic:
                return clean(arithmetic[op](a, b))
            if op == "^":  # numpy says nan ** 0 == 1 ** nan == 1; a null operand gives null
                return null_if_any(clean(np.power(a, b)), a, b)
            compare = {
                "<": np.less,
                "<=": np.less_equal,
                ">": np.greater,
                ">=": np.greater_equal,
                "==": np.equal,
                "!=": np.not_equal,
            }
            if op in compare:
                return null_if_any(compare[op](a, b).astype(float), a, b)
            both = (a != 0) & (b != 0) if op == "and" else (a != 0) | (b != 0)
            return null_if_any(both.astype(float), a, b)
        case Call(function, args):
            xs = [_numpy_value(a, df) for a in args]
            return clean(_numpy_call(function, xs, args))
    raise ValueError(f"unknown formula node {node!r}")


def _numpy_call(function: str, xs: list[np.ndarray], args: tuple[Node, ...]) -> np.ndarray:
    unary = {
        "abs": np.abs,
        "sqrt": np.sqrt,
        "exp": np.exp,
        "ln": np.log,
        "log10": np.log10,
        "floor": np.floor,
        "ceil": np.ceil,
        "sign": np.sign,
    }
    if function in unary:
        return unary[function](xs[0])
    if function == "round":  # half away from zero, exactly (no `floor(y + 0.5)` rounding)
        scale = 10.0 ** (args[1].value if len(args) == 2 and isinstance(args[1], Number) else 0)
        y = xs[0] * scale
        whole = np.trunc(y)
        return (whole + np.sign(y) * (np.abs(y - whole) >= 0.5)) / scale
    if function in ("min", "max"):
        pick = np.minimum if function == "min" else np.maximum
        out = xs[0]
        for x in xs[1:]:
            out = pick(out, x)  # NaN (null) wins, as a null operand does
        return out
    c, a, b = xs  # if
    return np.where(np.isnan(c), np.nan, np.where(c != 0, a, b))


def _as_type(x: np.ndarray, ctype: ColumnType, index: pd.Index) -> pd.Series:
    if ctype in (ColumnType.INT, ColumnType.LONG):
        bound = 2.0**31 if ctype is ColumnType.INT else 2.0**63
        t = np.trunc(x)
        inside = np.where((t >= -bound) & (t < bound), t, np.nan)
        return pd.Series(inside, index=index).astype("Int64")
    if ctype is ColumnType.BOOLEAN:
        return pd.Series(np.where(np.isnan(x), None, x != 0), index=index, dtype="boolean")
    return pd.Series(x, index=index)  # double; a timestamp stays milliseconds (only counted)


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


# Bounds an open-ended removed range is clipped to (pandas' timestamps span 1677 to 2262).
_EARLIEST = datetime(1900, 1, 1, tzinfo=UTC)
_LATEST = datetime(2200, 1, 1, tzinfo=UTC)


def reaches_removed(starts: pd.Series, spec: RollupSpec, removed: Sequence[Window]) -> pd.Series:
    """Which of the bucket starts `starts` (UTC) begin a bucket reaching into a `removed` range:
    from the bucket holding a range's first instant to the one holding its last."""
    hit = pd.Series(False, index=starts.index)
    for w in removed:
        lo, hi = max(w.start, _EARLIEST), min(w.end, _LATEST) - timedelta(microseconds=1)
        ends = pd.to_datetime(pd.Series([lo, hi]), utc=True)
        first, last = bucket_starts(ends, spec)
        hit |= (starts >= first) & (starts <= last)
    return hit


def compare_all(
    query,
    raw: pd.DataFrame,
    catalog: Catalog,
    only_before: dict | None = None,
    names: list[str] | None = None,
    removed: Sequence[Window] = (),
    skipped: dict[str, int] | None = None,
) -> list[str]:
    """Compare every rollup (or `names`), optionally only buckets starting before a per-rollup
    instant. `query(name)` returns the rollup's rows as Arrow.

    Buckets reaching into a `removed` range (raw rows retention removed) are not compared at any
    level: their stored values are the only record, and a fresh aggregation of what is left
    would differ. How many stored buckets each rollup has there is counted in `skipped`."""
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
        if removed:
            expected = expected[~reaches_removed(expected["bucket_start"], spec, removed)]
            starts = pd.to_datetime(pd.Series(actual["bucket_start"].to_pylist()), utc=True)
            gone = reaches_removed(starts, spec, removed)
            if skipped is not None:
                skipped[spec.name] = int(starts[gone].nunique())
            actual = actual.filter(pa.array((~gone).to_numpy()))
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
