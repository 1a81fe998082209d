"""The table-wide fold (`fold_tables.fold`) against the per-cell reference (`fold_cell`, cell by
cell): the same rows bit for bit (NaN, infinities and -0.0 included) and the same cells it cannot
know, for a double and a long column under every aggregate function, at the first level and one
level up, over a local midnight; and an integer sum leaving 64 bits is refused by name. Every
test runs twice: the fold's grouped operations, and its path for a few cells (one at a time),
which give the same rows in the same order. `difference_rows` against the same rows built row
by row."""

import math
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.compute import fold_tables
from rollup_assets.compute.arrow_partials import partials_arrow
from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.fold_extremes import Side, fold_extreme
from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.folding import (
    ENTERING,
    LEAVING,
    STAMPS,
    FoldPlan,
    Unknowable,
    difference_rows,
    fold_cell,
)
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.partials import (
    DELTA_COLUMN,
    GENERATION,
    RAW_ROWS,
    SPARES,
    ExtremeState,
    _key,
)
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.resources.schemas import data_schema


@pytest.fixture(scope="module", autouse=True, params=[0, 10**9], ids=["grouped", "one-at-a-time"])
def fold_path(request: pytest.FixtureRequest):
    """The cells folded one at a time at most: none (grouped operations) or all."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fold_tables, "FEW_CELLS", request.param)
        yield request.param


# Every function over a double and a long column, at two levels.
AGGREGATIONS = [
    {"column": c, "function": f, "target": f"{c}_{f.lower()}"}
    for c in ("x", "k")
    for f in ["Sum", "Min", "Max", "Avg", "Count"]
]
ZONE = {"reference_time_zone": "Europe/Vienna", "aggregations": AGGREGATIONS}
CATALOG = parse_catalog(
    {
        "raw_archives": {"m_raw": {"columns": {"x": "double", "k": "long"}}},
        "rollups": {
            "m_hourly": {
                "source": "m_raw",
                "alignment": "FixedSize",
                "size": "1h",
                "start": "2025-01-01",
                **ZONE,
            },
            "m_daily": {"source": "m_hourly", "alignment": "CalendarDay", **ZONE},
        },
    }
)
RAW = CATALOG.archive("m_raw")
HOURLY = CATALOG.rollup("m_hourly")
DAILY = CATALOG.rollup("m_daily")
# Three hours around a Vienna midnight (23:00 UTC), the night before the spring DST switch.
T0 = datetime(2025, 3, 29, 22, tzinfo=UTC)
SLOTS = 3 * 60
SCHEMA = pa.schema([("entity_id", pa.string()), ("ts", TS), ("x", pa.float64()), ("k", pa.int64())])
X = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False).map(lambda v: round(v, 3)),
    st.sampled_from([0.0, -0.0, 0.1, 1e-300, math.nan, math.inf, -math.inf]),
    st.none(),
)
K = st.one_of(st.integers(-(10**6), 10**6), st.none())
READING = st.tuples(X, K)
CELLS = st.tuples(st.sampled_from("abc"), st.integers(0, SLOTS - 1))
WAVE = st.lists(
    st.one_of(st.tuples(st.just("upsert"), CELLS, READING), st.tuples(st.just("delete"), CELLS)),
    max_size=25,
)


def raw(rows: dict) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"entity_id": e, "ts": T0 + timedelta(minutes=m), "x": x, "k": k}
            for (e, m), (x, k) in sorted(rows.items())
        ],
        SCHEMA,
    )


def feeds_of(start: dict, waves: list) -> list[pa.Table]:
    """Each wave's change rows, as the change feed shows them."""
    current, feeds = dict(start), []
    for wave in waves:
        before = dict(current)
        for op in wave:
            if op[0] == "upsert":
                current[op[1]] = op[2]
            else:
                current.pop(op[1], None)
        changes = []
        for key in sorted(set(before) | set(current)):
            old, new = before.get(key), current.get(key)
            if old is not None and new is not None and repr(old) == repr(new):
                continue
            if old is not None:
                changes.append((key, old, "update_preimage" if new is not None else "delete"))
            if new is not None:
                changes.append((key, new, "update_postimage" if old is not None else "insert"))
        rows = [
            {"entity_id": e, "ts": T0 + timedelta(minutes=m), "x": x, "k": k, "kind": kind}
            for (e, m), (x, k), kind in changes
        ]
        t = pa.Table.from_pylist(rows, SCHEMA.append(pa.field("kind", pa.string())))
        feeds.append(t)
    return feeds


def bases(spec, rows: pa.Table, source, generation: int = 1) -> pa.Table:
    b = Bucketing.of(spec)
    windows = list(b.windows(T0 - timedelta(hours=1), T0 + timedelta(minutes=SLOTS + 60)))
    out = partials_arrow(rows, windows, None, spec, source)
    out = out.drop_columns([c for c in ("source_rows",) if c in out.column_names])
    n = out.num_rows
    out = out.append_column(DELTA_COLUMN, pa.array([False] * n))
    out = out.append_column(GENERATION, pa.array([generation] * n, pa.int64()))
    return out.append_column("run_id", pa.array([f"r{generation}"] * n, pa.string()))


def visible(spec, base: pa.Table, feeds: list[pa.Table]) -> pa.Table:
    """`base` and each feed's difference rows, a generation each."""
    b = Bucketing.of(spec)
    parts = [base]
    for g, feed in enumerate(feeds, start=2):
        d = difference_rows(feed, spec, "ts", "kind", b)
        d = d.append_column(GENERATION, pa.array([g] * d.num_rows, pa.int64()))
        parts.append(d.append_column("run_id", pa.array([f"r{g}"] * d.num_rows, pa.string())))
    rows = pa.concat_tables(parts, promote_options="default")
    schema = data_schema(spec)  # as a read holds them
    return pa.table(
        [
            rows[f.name].cast(f.type, safe=False)
            if f.name in rows.column_names
            else pa.nulls(len(rows), f.type)
            for f in schema
        ],
        schema=schema,
    )


def by_cell(rows: pa.Table, spec) -> tuple[pa.Table, set]:
    """The reference: every cell folded by `fold_cell`, cell by cell."""
    plan = FoldPlan.of(spec)
    groups: dict = {}
    for r in rows.to_pylist():
        groups.setdefault((r["entity_id"], r["bucket_start"]), []).append(r)
    out, unknowable = [], set()
    for key, group in groups.items():
        if not any(r[DELTA_COLUMN] for r in group):
            out += group
            continue
        group.sort(key=lambda r: r[GENERATION])
        base = ([r for r in group if not r[DELTA_COLUMN]] or [None])[-1]
        try:
            row = fold_cell(base, [r for r in group if r[DELTA_COLUMN]], spec, plan=plan)
        except Unknowable:
            unknowable.add(key)
            continue
        if row is not None:
            out.append({**row, **{s: group[-1][s] for s in STAMPS if s in group[-1]}})
    return pa.Table.from_pylist(out, schema=rows.schema), unknowable


def difference_rows_by_row(changes: pa.Table, spec, bucketing: Bucketing) -> pa.Table:
    """The reference: each change row put in its cell one by one."""
    cells: dict = {}
    columns = spec.aggregated_columns
    for r in changes.to_pylist():
        if r["kind"] not in ENTERING | LEAVING:
            continue
        w = bucketing.window_of(r["ts"])
        values = cells.setdefault((w.start, r["entity_id"]), (w, {c: ([], []) for c in columns}))
        for c in columns:
            values[1][c][0 if r["kind"] in ENTERING else 1].append(r[c])
    ordered = sorted(cells.items(), key=lambda kv: kv[0])
    out = {
        "entity_id": pa.array([k[1] for k, _ in ordered], pa.string()),
        "bucket_start": pa.array([w.start for _, (w, _) in ordered], TS),
        "bucket_end": pa.array([w.end for _, (w, _) in ordered], TS),
        DELTA_COLUMN: pa.array([True] * len(ordered), pa.bool_()),
    }
    for plan in FoldPlan.of(spec).columns:
        typ = pa.list_(changes.schema.field(plan.column).type)
        out[plan.entering] = pa.array([v[plan.column][0] for _, (_, v) in ordered], typ)
        out[plan.leaving] = pa.array([v[plan.column][1] for _, (_, v) in ordered], typ)
    return pa.table(out)


@settings(max_examples=60, deadline=None)
@given(
    start=st.dictionaries(CELLS, READING, max_size=40),
    waves=st.lists(WAVE, min_size=1, max_size=3),
    hours=st.integers(0, 24 * 40),
)
def test_difference_rows_equal_those_built_row_by_row(start, waves, hours) -> None:
    # Shifted by up to 40 days from a night before the spring DST switch: across it.
    shift = timedelta(hours=hours)
    for feed in feeds_of(start, waves):
        at = feed.schema.get_field_index("ts")
        feed = feed.set_column(at, "ts", pc.add(feed["ts"], pa.scalar(shift, pa.duration("us"))))
        if feed.num_rows:  # a change type that moves nothing (none the feed gives) is passed over
            other = feed.slice(0, 1).drop_columns(["kind"])
            other = other.append_column("kind", pa.array(["other"]))
            feed = pa.concat_tables([feed, other])
        for spec in (HOURLY, DAILY):
            b = Bucketing.of(spec)
            got = difference_rows(feed, spec, "ts", "kind", b)
            want = difference_rows_by_row(feed, spec, b)
            assert got.schema == want.schema
            assert (
                all(identical(g, w) for g, w in zip(got.to_pylist(), want.to_pylist(), strict=True))
                and got.num_rows == want.num_rows
            )


def identical(a, b) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(identical(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(identical(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return type(a) is type(b) and a == b


def assert_same(rows: pa.Table, spec) -> None:
    got, unknown = fold(rows, spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fold_tables, "FEW_CELLS", 0 if fold_tables.FEW_CELLS else 10**9)
        other, other_unknown = fold(rows, spec)
    assert other_unknown == unknown
    assert identical(other.to_pylist(), got.to_pylist()) and other.schema == got.schema
    want, unknowable = by_cell(rows, spec)
    assert set(unknown) == unknowable
    order = [("entity_id", "ascending"), ("bucket_start", "ascending")]
    got_rows = got.sort_by(order).to_pylist()
    want_rows = want.sort_by(order).to_pylist()
    assert len(got_rows) == len(want_rows)
    for g, w in zip(got_rows, want_rows, strict=True):
        for column in w:
            assert identical(g[column], w[column]), (g["entity_id"], column, g[column], w[column])


@settings(max_examples=120, deadline=None)
@given(
    start=st.dictionaries(CELLS, READING, max_size=40),
    waves=st.lists(WAVE, min_size=1, max_size=4),
    blind=st.booleans(),
)
def test_the_table_fold_equals_folding_each_cell_by_itself(start, waves, blind) -> None:
    feeds = feeds_of(start, waves)
    hourly = bases(HOURLY, raw(start), RAW)
    if blind and hourly.num_rows:  # a base written before companions were kept
        at = hourly.schema.get_field_index(RAW_ROWS)
        nulls = [None, *hourly[RAW_ROWS].to_pylist()[1:]]
        hourly = hourly.set_column(at, RAW_ROWS, pa.array(nulls, pa.int64()))
    assert_same(visible(HOURLY, hourly, feeds), HOURLY)
    daily = bases(
        DAILY,
        bases(HOURLY, raw(start), RAW).drop_columns([DELTA_COLUMN, GENERATION, "run_id"]),
        HOURLY,
    )
    assert_same(visible(DAILY, daily, feeds), DAILY)


def test_a_cell_with_an_older_base_folds_from_the_newest_and_rows_without_differences_pass() -> (
    None
):
    start = {("a", 5): (1.0, 3), ("a", 70): (2.0, 4), ("b", 5): (3.0, 5)}
    newer = {**start, ("a", 6): (-0.0, -7)}
    feeds = feeds_of(newer, [[("upsert", ("a", 7), (math.nan, 1)), ("delete", ("a", 5))]])
    rows = visible(
        HOURLY,
        pa.concat_tables([bases(HOURLY, raw(start), RAW, 0), bases(HOURLY, raw(newer), RAW, 1)]),
        feeds,
    )
    assert_same(rows, HOURLY)
    plain = visible(HOURLY, bases(HOURLY, raw(start), RAW), [])
    assert fold(plain, HOURLY) == (plain, [])


def test_an_integer_sum_leaving_64_bits_is_refused_naming_the_column_and_the_cell() -> None:
    start = {("a", 5): (1.0, 2**62), ("a", 6): (1.0, 2**62 - 1)}
    feeds = feeds_of(start, [[("upsert", ("a", 7), (1.0, 2**62))]])
    rows = visible(HOURLY, bases(HOURLY, raw(start), RAW), feeds)
    with pytest.raises(OverflowError, match=r"'k' in cell \(a, 2025-03-29T22:00:00\+00:00\)"):
        fold(rows, HOURLY)
    # Terms past 2^62 whose sum fits are exact (the average's double sum rounds them).
    fits = feeds_of(start, [[("upsert", ("a", 7), (1.0, -(2**62)))]])
    got, _ = fold(visible(HOURLY, bases(HOURLY, raw(start), RAW), fits), HOURLY)
    assert got.column("k_sum").to_pylist() == [2**62 - 1]
    assert got.column("k_avg__sum").to_pylist() == [float(2**62 - 1)]


def folded_in_steps(spec, base: pa.Table, feeds: list[pa.Table], at: int) -> tuple[pa.Table, set]:
    """`base` with `feeds[:at]` folded into a new base (as maintenance does), then the rest; and
    the cells either step could not fold."""
    rows = visible(spec, base, feeds)
    older = pc.less_equal(rows[GENERATION], at + 1)
    first, unknown = fold(rows.filter(older), spec)
    second, more = fold(pa.concat_tables([first, rows.filter(pc.invert(older))]), spec)
    return second, {*unknown, *more}


def shown(rows: pa.Table, leave_out: set) -> list[dict]:
    """The rows' cells but `leave_out`, without the kept extremes (a prefix may hold more or
    fewer spares after two steps; the extreme it shows is the same) and the stamps."""
    spares = {c.name for c in HOURLY.companions if c.kind in ("lo", "hi")}
    keep = [c for c in rows.column_names if c not in STAMPS and c not in spares]
    out = rows.select(keep).sort_by([("entity_id", "ascending"), ("bucket_start", "ascending")])
    return [r for r in out.to_pylist() if (r["entity_id"], r["bucket_start"]) not in leave_out]


def test_a_sum_folded_in_two_steps_is_the_same_bits_as_one_folded_at_once() -> None:
    # 1.0 + 1e-16 rounds back to 1.0, 1.0 + 2e-16 does not: a total that added all its
    # differences at once would change when maintenance folded the first of them.
    start = {("a", 5): (1.0, 1)}
    feeds = feeds_of(
        start, [[("upsert", ("a", 6), (1e-16, 1))], [("upsert", ("a", 7), (1e-16, 1))]]
    )
    base = bases(HOURLY, raw(start), RAW)
    once, _ = fold(visible(HOURLY, base, feeds), HOURLY)
    steps, _ = folded_in_steps(HOURLY, base, feeds, 1)
    assert once.column("x_sum").to_pylist() == steps.column("x_sum").to_pylist() == [1.0]
    reference, _ = by_cell(visible(HOURLY, base, feeds), HOURLY)
    assert reference.column("x_sum").to_pylist() == [1.0]


@settings(max_examples=60, deadline=None)
@given(
    start=st.dictionaries(CELLS, READING, max_size=40),
    waves=st.lists(WAVE, min_size=2, max_size=4),
    at=st.integers(1, 3),
)
def test_any_fold_in_steps_shows_what_folding_at_once_does(start, waves, at) -> None:
    feeds = feeds_of(start, waves)
    at = min(at, len(feeds) - 1)
    base = bases(HOURLY, raw(start), RAW)
    once, unknown = fold(visible(HOURLY, base, feeds), HOURLY)
    steps, unknown_in_steps = folded_in_steps(HOURLY, base, feeds, at)
    leave_out = {*unknown, *unknown_in_steps}
    assert identical(shown(once, leave_out), shown(steps, leave_out))


def test_a_finite_sum_that_overflows_is_a_cell_to_aggregate_again_not_an_error() -> None:
    start = {("a", 5): (1.0, 1), ("b", 5): (1.0, 1)}
    feeds = feeds_of(start, [[("upsert", ("a", 6), (1e308, 1)), ("upsert", ("a", 7), (1e308, 1))]])
    got, unknown = fold(visible(HOURLY, bases(HOURLY, raw(start), RAW), feeds), HOURLY)
    assert [e for e, _ in unknown] == ["a"]
    assert got.column("entity_id").to_pylist() == ["b"]


SMALL = st.sampled_from([0.0, -0.0, 1.0, 2.0, 2.5, -3.0, math.nan, math.inf, -math.inf])
CELL = st.tuples(
    st.lists(SMALL, max_size=10),  # the cell's values
    st.integers(0, 10),  # how many of them its prefix keeps
    st.lists(SMALL, max_size=5),  # values entering
    st.lists(st.one_of(st.integers(0, 9), SMALL), max_size=5),  # leaving: a value's index, or any
)


@settings(max_examples=300, deadline=None)
@given(cells=st.lists(CELL, min_size=1, max_size=8), largest=st.booleans(), k=st.integers(1, 8))
def test_kept_extremes_fold_as_each_cell_applies_its_changes_even_inconsistent_ones(
    cells, largest, k
) -> None:
    # Leaving values that are not the cell's (a change feed out of step with the base) must
    # come out as the reference says too: exhausted, never a wrong prefix.
    prefixes, lengths, base_n, entering, leaving, states = [], [], [], [], [], []
    for c, (values, kept, joining, left) in enumerate(cells):
        ordered = sorted(values, key=_key, reverse=largest)
        prefix = ordered[: min(kept, SPARES)]
        gone = [ordered[x % len(ordered)] if isinstance(x, int) and ordered else x for x in left]
        gone = [v for v in gone if not isinstance(v, int)]
        prefixes += [(c, v) for v in prefix]
        lengths.append(len(prefix))
        base_n.append(len(values))
        entering += [(c, v) for v in joining]
        leaving += [(c, v) for v in gone]
        states.append(ExtremeState(largest, tuple(prefix), len(values)).apply(joining, gone, k))

    def side(pairs: list) -> Side:
        return Side(
            pa.array([v for _, v in pairs], pa.float64()), np.array([c for c, _ in pairs], np.int64)
        )

    n = np.array(base_n) + np.bincount([c for c, _ in entering], minlength=len(cells))
    n -= np.bincount([c for c, _ in leaving], minlength=len(cells))
    got = fold_extreme(
        side(prefixes),
        np.array(lengths),
        np.array(base_n),
        side(entering),
        side(leaving),
        n,
        largest,
        k,
    )
    for c, state in enumerate(states):
        assert bool(got.exhausted[c]) == state.exhausted, c
        if not state.exhausted:
            assert [repr(v) for v in got.prefix[c].as_py()] == [repr(v) for v in state.prefix], c
