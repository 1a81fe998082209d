"""Partials corrected from changes (model.deltas) against a fresh aggregation of the rows."""

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.model.deltas import (
    CANCELLATION_LIMIT,
    Change,
    ChangeType,
    StoredCell,
    apply_changes,
    apply_to_cells,
    merge_into_cells,
)
from rollup_assets.model.specs import ColumnType, StoredColumn

COLUMNS = (
    StoredColumn("e_sum", "e", "sum", ColumnType.DOUBLE),
    StoredColumn("e_count", "e", "count", ColumnType.LONG),
    StoredColumn("p_sum", "p", "sum", ColumnType.DOUBLE),  # no count of p: may not turn null
    StoredColumn("v_min", "v", "min", ColumnType.DOUBLE),
    StoredColumn("v_max", "v", "max", ColumnType.DOUBLE),
    StoredColumn("n_sum", "n", "sum", ColumnType.LONG),
    StoredColumn("n_count", "n", "count", ColumnType.LONG),
)
Row = dict[str, Any]


def aggregate(rows: list[Row]) -> dict[str, Any]:
    """What a fresh aggregation stores for `rows` (SQL semantics: nulls ignored)."""
    out: dict[str, Any] = {}
    for sc in COLUMNS:
        values = [r[sc.column] for r in rows if r[sc.column] is not None]
        if sc.partial == "count":
            out[sc.name] = len(values)
        elif not values:
            out[sc.name] = None
        elif sc.partial == "sum":
            out[sc.name] = sum(values) if sc.type is ColumnType.LONG else math.fsum(values)
        else:
            out[sc.name] = min(values) if sc.partial == "min" else max(values)
    return out


def close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))
    return bool(a == b)


def row(e: float | None = 1.0, p: float | None = 2.0, v: float | None = 230.0, n: int | None = 1):
    return {"e": e, "p": p, "v": v, "n": n}


def change(kind: ChangeType, r: Row) -> Change:
    return Change(kind, r)


def update(old: Row, new: Row) -> list[Change]:
    return [change(ChangeType.UPDATE_PREIMAGE, old), change(ChangeType.UPDATE_POSTIMAGE, new)]


def test_inserts_and_updates_are_applied_exactly() -> None:
    rows = [row(1.0, 2.0, 230.0, 1), row(2.0, None, 228.0, 2), row(0.5, 4.0, 231.0, None)]
    stored = aggregate(rows)
    new = row(3.0, 1.0, 229.0, 5)
    fixed = row(7.0, 2.0, 230.0, 1)  # rows[0] corrected (its voltage is neither extreme)
    changes = [change(ChangeType.INSERT, new), *update(rows[0], fixed)]
    result = apply_changes(stored, changes, COLUMNS)
    assert result.applied, result.reason
    expected = aggregate([fixed, rows[1], rows[2], new])
    assert all(close(result.partials[k], expected[k]) for k in expected), (result, expected)


@pytest.mark.parametrize(
    ("rows", "changes", "reason"),
    [
        # The reading holding the minimum voltage is corrected upwards.
        (
            [row(v=220.0), row(v=230.0)],
            update(row(v=220.0), row(v=225.0)),
            "retracts the stored min",
        ),
        ([row(v=220.0), row(v=230.0)], update(row(v=230.0), row(v=225.0)), "stored max"),
        ([row(), row()], [change(ChangeType.DELETE, row())], "a delete may leave the cell empty"),
        ([row(v=220.0)], update(row(v=220.0), row(v=float("nan"))), "NaN"),
        ([row(e=1.0)], [change(ChangeType.INSERT, row(e=math.inf))], "NaN or infinite"),
        # p has no count: a value leaving with none entering may leave the sum null.
        ([row(p=2.0)], update(row(p=2.0), row(p=None)), "may become null"),
        # 1e12 leaves a sum that was 1e12 + 1: the stored sum's rounding would show.
        ([row(e=1e12), row(e=1.0)], update(row(e=1e12), row(e=0.5)), "nearly cancel"),
    ],
)
def test_changes_that_need_the_source_rows_say_why(
    rows: list[Row], changes: list[Change], reason: str
) -> None:
    result = apply_changes(aggregate(rows), changes, COLUMNS)
    assert not result.applied
    assert result.reason is not None and reason in result.reason


def test_a_retracted_value_below_the_extreme_is_applied() -> None:
    rows = [row(v=220.0), row(v=226.0), row(v=230.0)]
    result = apply_changes(aggregate(rows), update(rows[1], row(v=228.0)), COLUMNS)
    assert result.applied and result.partials is not None
    assert (result.partials["v_min"], result.partials["v_max"]) == (220.0, 230.0)


def test_the_last_counted_value_leaving_turns_the_sum_null() -> None:
    rows = [row(e=1.0, n=3)]
    result = apply_changes(aggregate(rows), update(rows[0], row(e=1.0, n=None)), COLUMNS)
    assert result.applied and result.partials is not None
    assert (result.partials["n_sum"], result.partials["n_count"]) == (None, 0)


def test_a_value_entering_and_leaving_within_the_changes_cancels() -> None:
    """Inserted at one version and corrected at the next: only the corrected value enters, so
    the stored minimum is not taken for retracted."""
    rows = [row(v=225.0)]
    late = row(v=210.0)
    changes = [change(ChangeType.INSERT, late), *update(late, row(v=226.0))]
    result = apply_changes(aggregate(rows), changes, COLUMNS)
    assert result.applied and result.partials is not None
    assert (result.partials["v_min"], result.partials["v_max"]) == (225.0, 226.0)


def test_cells_take_only_the_changes_after_their_version() -> None:
    rows = [row(e=1.0), row(e=2.0)]
    extra = row(e=5.0)
    stored = {"a": StoredCell(3, aggregate(rows)), "b": StoredCell(5, aggregate([*rows, extra]))}
    changes = [
        ("a", 4, change(ChangeType.INSERT, extra)),
        ("b", 4, change(ChangeType.INSERT, extra)),  # already in b's stored partials
        ("c", 4, change(ChangeType.INSERT, extra)),  # not a cell of this apply
    ]
    out = apply_to_cells(["a", "b", "missing"], stored, changes, COLUMNS)
    assert out.changed["a"]["e_sum"] == 8.0
    assert out.unchanged == {"b"}
    assert out.recompute == {"missing": "no stored partial to correct"}
    assert out.change_rows == 1


def sometimes_null(values: st.SearchStrategy) -> st.SearchStrategy:
    """`values`, null one time in eight (optional columns)."""
    return st.integers(0, 7).flatmap(lambda k: st.none() if k == 0 else values)


# Few distinct values, so a change often retracts a stored extreme or repeats a value.
VALUES = sometimes_null(
    st.one_of(st.integers(-5, 5).map(float), st.floats(-1e3, 1e3, allow_nan=False))
)
ROWS = st.builds(row, e=VALUES, p=VALUES, v=VALUES, n=sometimes_null(st.integers(-(10**6), 10**6)))


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Row], list[list[tuple[str, int, Row]]]]:
    """Initial rows and versions of random changes: ('insert', -, row), ('update', i, row),
    ('delete', i, -), on the rows alive at that point."""
    rows = draw(st.lists(ROWS, min_size=0, max_size=6))
    alive = len(rows)
    versions = []
    for _ in range(draw(st.integers(1, 4))):
        ops = []
        for _ in range(draw(st.integers(0, 4))):
            kinds = ["insert", "update", "update", "update", "delete"] if alive else ["insert"]
            kind = draw(st.sampled_from(kinds))
            if kind == "insert":
                ops.append(("insert", -1, draw(ROWS)))
                alive += 1
            else:
                i = draw(st.integers(0, alive - 1))
                ops.append((kind, i, draw(ROWS)))
                alive -= kind == "delete"
        versions.append(ops)
    return rows, versions


@settings(max_examples=300, deadline=None)
@given(histories(), st.data())
def test_applying_changes_equals_a_fresh_aggregation(history, data) -> None:
    """For random rows and versions of random changes, a cell stored at any version and
    corrected by the changes after it equals a fresh aggregation of the final rows, or says it
    needs them; and a history of inserts alone is always applied."""
    rows, versions = history
    states = [list(rows)]
    tagged: list[tuple[str, int, Change]] = []
    current = list(rows)
    for number, ops in enumerate(versions, start=1):
        for kind, i, new in ops:
            if kind == "insert":
                current.append(new)
                tagged.append(("cell", number, change(ChangeType.INSERT, new)))
            elif kind == "update":
                tagged += [("cell", number, c) for c in update(current[i], new)]
                current[i] = new
            else:
                tagged.append(("cell", number, change(ChangeType.DELETE, current.pop(i))))
        states.append(list(current))
    at = data.draw(st.integers(0, len(versions)), label="stored at version")
    if not states[at]:
        return  # no row: an empty cell is not stored
    stored = {"cell": StoredCell(at, aggregate(states[at]))}
    out = apply_to_cells(["cell"], stored, tagged, COLUMNS)
    expected = aggregate(current)
    if "cell" in out.recompute:
        inserts_only = all(c.type is ChangeType.INSERT for _, v, c in tagged if v > at)
        assert not inserts_only, out.recompute
        return
    got = out.changed.get("cell", stored["cell"].partials)
    assert all(close(got[k], expected[k]) for k in expected), (got, expected)


def test_cancellation_limit_keeps_sums_within_the_checks_tolerance() -> None:
    """The largest retraction still applied loses at most a 1e-9 relative error."""
    big = CANCELLATION_LIMIT / 4  # the stored sum and the value leaving: half the limit
    rows = [row(e=big), row(e=1.0 / 3.0)]
    result = apply_changes(aggregate(rows), update(rows[0], row(e=0.25)), COLUMNS)
    assert result.applied and result.partials is not None
    assert close(result.partials["e_sum"], 0.25 + 1.0 / 3.0)


# A rollup over a rollup keeps the same partials under the same names: each merges its own.
MERGED = {sc.name: sc.name for sc in COLUMNS}


def partials(rows: list[Row]) -> dict[str, Any] | None:
    """A cell below: its stored partials, or None when it has no row (no source rows)."""
    return aggregate(rows) if rows else None


def merged(cells: dict[str, list[Row]], replaced: dict[str, list[Row]]):
    """The cell above `cells` corrected from the replaced cells below, and what a fresh merge of
    every cell below after the change stores."""
    after = {**cells, **replaced}
    pairs = [(partials(cells.get(k, [])), partials(rows)) for k, rows in replaced.items()]
    stored = aggregate([r for rows in cells.values() for r in rows])
    out = merge_into_cells(["up"], {"up": stored}, {"up": pairs}, COLUMNS, MERGED)
    return out, aggregate([r for rows in after.values() for r in rows])


def test_cells_above_take_the_old_partials_out_and_the_new_in() -> None:
    hours = {
        "h1": [row(1.0, 2.0, 230.0, 1), row(2.0, None, 228.0, 2)],
        "h2": [row(0.5, 4.0, 231.0, None)],
        "h3": [row(3.0, 1.0, 229.0, 5)],
    }
    # h1's readings change (its extremes move outward), a new hour appears.
    out, expected = merged(
        hours,
        {"h1": [row(1.5, 2.0, 232.0, 1), row(2.0, 3.0, 227.0, 4)], "h4": [row(1.0, 1.0, 230.0, 2)]},
    )
    assert out.changed["up"] == pytest.approx(expected)
    assert out.change_rows == 2 and not out.recompute


def test_an_extreme_only_moving_outward_below_retracts_nothing() -> None:
    """h2 holds the maximum; a new higher reading in h2 replaces its max, which is no
    retraction of the stored maximum (the new one is higher)."""
    hours = {"h1": [row(v=229.0)], "h2": [row(v=231.0)]}
    out, expected = merged(hours, {"h2": [row(v=231.0), row(v=235.0)]})
    assert out.changed["up"]["v_max"] == expected["v_max"] == 235.0


def test_a_retracted_extreme_or_an_emptied_cell_below_is_merged_again() -> None:
    hours = {"h1": [row(v=229.0)], "h2": [row(v=231.0)]}
    out, _ = merged(hours, {"h2": [row(v=230.0)]})  # h2 held the max, which drops
    assert out.recompute == {"up": "v_max: a change retracts the stored max"}
    out, _ = merged(hours, {"h1": []})  # h1 lost every row: the cell above may be empty
    assert out.recompute == {"up": "a cell below was emptied, so the cell may be empty"}
    out = merge_into_cells(["up", "new"], {"up": aggregate(hours["h1"])}, {}, COLUMNS, MERGED)
    assert out.unchanged == {"up"} and out.recompute == {"new": "no stored partial to correct"}


CELLS_BELOW = st.dictionaries(
    st.sampled_from(["h1", "h2", "h3", "h4"]), st.lists(ROWS, min_size=1, max_size=4), max_size=4
)


@settings(max_examples=300, deadline=None)
@given(CELLS_BELOW, st.data())
def test_merging_replaced_partials_equals_a_fresh_merge(cells, data) -> None:
    """For random cells below and random replacements of some of them (changed rows, new cells,
    emptied cells), the cell above corrected from the old and new partials equals a fresh merge
    of every cell below, or says it needs one."""
    if not cells:
        return  # nothing below: the cell above has no row
    keys = data.draw(st.lists(st.sampled_from(["h1", "h2", "h3", "h4", "h5"]), unique=True))
    replaced = {k: data.draw(st.lists(ROWS, max_size=4), label=k) for k in keys}
    out, expected = merged(cells, replaced)
    if "up" in out.recompute:
        return
    got = out.changed.get("up", aggregate([r for rows in cells.values() for r in rows]))
    assert all(close(got[k], expected[k]) for k in expected), (got, expected)
