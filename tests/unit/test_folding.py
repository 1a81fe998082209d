"""Base plus differences against a fresh aggregation, with the Arrow readings the stores use:
a cell's base row (`partials_arrow`, companions included) with the difference rows of any
sequence of upserts and deletes (`difference_rows`) folded in (`fold`) shows what aggregating
the rows the cell holds now shows, at the first level and one level up (the same difference
rows applied to the daily cell built from the hourly bases). A fold may refuse a cell only when
at least as many values left it as it keeps spares (`Unknowable`), never give a wrong value."""

import math
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.compute.arrow_partials import logical_arrow, partials_arrow
from rollup_assets.compute.arrow_types import (
    TS,
    by_start_and_entity,
    instants,
    instants_of,
    is_by_start_and_entity,
)
from rollup_assets.compute.fold_tables import fold
from rollup_assets.compute.folding import Unknowable, difference_rows, fold_cell
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.partials import DELTA_COLUMN, GENERATION, SPARES, is_nan
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window

CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")
DAILY = CATALOG.rollup("energy_daily")
RAW = CATALOG.archive("energy_raw")
# Three hours of one Vienna day, a reading per minute at most: a cell can hold more values
# than it keeps spares.
T0 = datetime(2025, 8, 13, 22, tzinfo=UTC) + timedelta(hours=3)
SLOTS = 3 * 60

VALUES = st.one_of(
    st.floats(-1e3, 1e3, allow_nan=False).map(lambda v: round(v, 2)),
    st.sampled_from([0.0, 1.5, 230.0, math.nan, math.inf, -math.inf]),
    st.none(),
)
READING = st.tuples(VALUES, VALUES)  # (power_kw, voltage_v); energy follows the power
# A wave: readings upserted at (entity, minute) and deletes of (entity, minute).
WAVE = st.lists(
    st.one_of(
        st.tuples(st.just("upsert"), st.sampled_from("ab"), st.integers(0, SLOTS - 1), READING),
        st.tuples(st.just("delete"), st.sampled_from("ab"), st.integers(0, SLOTS - 1)),
    ),
    max_size=30,
)


def row(entity: str, minute: int, reading: tuple) -> dict:
    power, voltage = reading
    energy = 0.0 if power is None else power / 60
    current = None
    if power is not None and voltage not in (None, 0.0):
        current = power * 1000 / voltage
    return {
        "entity_id": entity,
        "ts": T0 + timedelta(minutes=minute),
        "energy_kwh": energy,
        "power_kw": power,
        "voltage_v": voltage,
        "current_a": current,
    }


SCHEMA = pa.schema(
    [
        ("entity_id", pa.string()),
        ("ts", TS),
        ("energy_kwh", pa.float64()),
        ("power_kw", pa.float64()),
        ("voltage_v", pa.float64()),
        ("current_a", pa.float64()),
    ]
)


def table(rows: dict) -> pa.Table:
    return pa.Table.from_pylist(list(rows.values()), SCHEMA)


def windows(spec) -> list[Window]:
    return list(Bucketing.of(spec).windows(T0, T0 + timedelta(minutes=SLOTS)))


def bases(spec, rows: pa.Table, source) -> pa.Table:
    """`spec`'s base rows of `rows` (of `source`), stored as a recompute stores them."""
    out = partials_arrow(rows, windows(spec), None, spec, source)
    out = out.drop_columns([c for c in ["source_rows"] if c in out.column_names])
    n = out.num_rows
    return out.append_column(DELTA_COLUMN, pa.array([False] * n)).append_column(
        GENERATION, pa.array([1] * n, pa.int64())
    )


def play(start: dict, waves: list[list]) -> tuple[dict, list[pa.Table], int]:
    """Apply the waves: the rows after, each wave's change rows (as the change feed shows them),
    and how many rows left a cell in all."""
    current = dict(start)
    feeds = []
    left = 0
    for wave in waves:
        before = dict(current)
        for op in wave:
            key = (op[1], op[2])
            if op[0] == "upsert":
                current[key] = row(op[1], op[2], op[3])
            else:
                current.pop(key, None)
        changes = []
        for key in sorted(set(before) | set(current)):
            old, new = before.get(key), current.get(key)
            if old == new or (old and new and _same_row(old, new)):
                continue
            if old is not None and new is not None:
                changes += [{**old, "kind": "update_preimage"}, {**new, "kind": "update_postimage"}]
                left += 1
            elif old is not None:
                changes.append({**old, "kind": "delete"})
                left += 1
            else:
                changes.append({**new, "kind": "insert"})
        feeds.append(pa.Table.from_pylist(changes, SCHEMA.append(pa.field("kind", pa.string()))))
    return current, feeds, left


def _same_row(a: dict, b: dict) -> bool:
    return all(same(a[k], b[k]) for k in a)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) and isinstance(b, float):
        if is_nan(a) or is_nan(b):
            return is_nan(a) and is_nan(b)
        if math.isinf(a) or math.isinf(b):
            return a == b
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)
    return a == b


def folded(spec, base: pa.Table, feeds: list[pa.Table]) -> tuple[pa.Table, list]:
    """`base` with each feed's difference rows (a generation each) folded in."""
    b = Bucketing.of(spec)
    parts = [base]
    for g, feed in enumerate(feeds, start=2):
        d = difference_rows(feed, spec, "ts", "kind", b)
        parts.append(d.append_column(GENERATION, pa.array([g] * d.num_rows, pa.int64())))
    rows = pa.concat_tables(parts, promote_options="default")
    return fold(rows, spec)


def logical(spec, rows: pa.Table) -> dict:
    keep = rows.select([c for c in rows.column_names if not c.endswith(("__in", "__out"))])
    out = logical_arrow(keep, spec).to_pylist()
    return {(r["entity_id"], r["bucket_start"]): r for r in out}


def check(spec, got: pa.Table, exhausted: list, want: pa.Table, left: int) -> None:
    expected = logical(spec, want)
    if exhausted:
        assert left >= SPARES, (exhausted, left)
    shown = logical(spec, got)
    assert set(shown) <= set(expected) and set(exhausted) <= set(expected)
    assert set(expected) - set(exhausted) <= set(shown)
    for key, values in expected.items():
        if key in exhausted:
            continue
        for column, v in values.items():
            assert same(shown[key][column], v), (key, column, shown[key][column], v)


@settings(max_examples=100, deadline=None)
@given(
    start=st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(0, SLOTS - 1), READING), max_size=40
    ),
    waves=st.lists(WAVE, min_size=1, max_size=4),
)
def test_a_base_plus_its_differences_shows_a_fresh_aggregation(start, waves) -> None:
    first = {(e, m): row(e, m, r) for e, m, r in start}
    now, feeds, left = play(first, waves)
    hourly = bases(HOURLY, table(first), RAW)
    got, exhausted = folded(HOURLY, hourly, feeds)
    check(HOURLY, got, exhausted, bases(HOURLY, table(now), RAW), left)
    # One level up: the daily cell built from the hourly bases, the same difference rows.
    daily = bases(DAILY, hourly.drop_columns([DELTA_COLUMN, GENERATION]), HOURLY)
    got, exhausted = folded(DAILY, daily, feeds)
    check(DAILY, got, exhausted, bases(DAILY, table(now), RAW), left)


def test_more_retractions_of_a_cells_minimum_than_it_keeps_spares_is_refused_not_wrong() -> None:
    first = {("a", m): row("a", m, (1.0, 200.0 + m)) for m in range(SPARES + 4)}
    # Each wave deletes the cell's current minimum voltage, one more than the spares kept.
    waves = [[("delete", "a", m)] for m in range(SPARES + 1)]
    _, feeds, left = play(first, waves)
    hourly = bases(HOURLY, table(first), RAW)
    got, exhausted = folded(HOURLY, hourly, feeds[: SPARES - 1])
    assert not exhausted  # one spare left: still exact
    check(HOURLY, got, exhausted, bases(HOURLY, table(play(first, waves[: SPARES - 1])[0]), RAW), 0)
    got, exhausted = folded(HOURLY, hourly, feeds)
    assert [k[0] for k in exhausted] == ["a"] and got.num_rows == 0
    assert left == SPARES + 1
    # The fold of a cell read alone says the same: it cannot be told, so it is aggregated again.
    cell = pa.concat_tables(
        [
            hourly,
            *(
                difference_rows(f, HOURLY, "ts", "kind", Bucketing.of(HOURLY)).append_column(
                    GENERATION, pa.array([g], pa.int64())
                )
                for g, f in enumerate(feeds, start=2)
            ),
        ],
        promote_options="default",
    ).to_pylist()
    with pytest.raises(Unknowable, match="voltage_v"):
        fold_cell(cell[0], cell[1:], HOURLY)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(-(2**52), 2**52), max_size=20), min_size=1, max_size=4))
def test_instants_are_arrows_own_reading_of_the_timestamps(chunks) -> None:
    column = pa.chunked_array([pa.array(c, pa.int64()).cast(TS) for c in chunks], TS)
    assert instants_of(column) == column.to_pylist()
    assert instants(column.cast(pa.int64()).to_numpy()) == column.to_pylist()
    with pytest.raises(ValueError, match="null instant"):
        instants_of(pa.array([0, None], pa.int64()).cast(TS))


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["m-b", "m-a", "m-ä", "M-z", "m-a ", ""]), st.integers(-5, 5)),
        max_size=40,
    ),
    st.integers(1, 4),
    st.booleans(),
)
def test_rows_sort_by_start_and_entity_as_arrow_sorts_them(rows, chunks, null) -> None:
    """Ties keep their input order (both sorts are stable); a null entity falls back to Arrow's
    sort."""
    entities = [e for e, _ in rows]
    if null and entities:
        entities[len(entities) // 2] = None
    table = pa.table(
        {
            "entity_id": pa.array(entities, pa.string()),
            "bucket_start": pa.array([s * 3_600_000_000 for _, s in rows], pa.int64()).cast(TS),
            "n": pa.array(range(len(rows)), pa.int64()),
        }
    )
    step = max(1, -(-len(rows) // chunks))
    table = pa.concat_tables(
        [table.slice(0, 0), *(table.slice(i, step) for i in range(0, len(rows), step))]
    )
    expected = table.sort_by([("bucket_start", "ascending"), ("entity_id", "ascending")])
    assert by_start_and_entity(table).to_pylist() == expected.to_pylist()
    keys = list(zip(table["bucket_start"].to_pylist(), entities, strict=True))
    if None not in entities and len(set(keys)) == len(keys):  # cells: one row each
        assert is_by_start_and_entity(expected)
        starts, names = expected["bucket_start"].to_pylist(), expected["entity_id"].to_pylist()
        in_order = list(zip(starts, names, strict=True))
        assert is_by_start_and_entity(table) == (keys == in_order)
