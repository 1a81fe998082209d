"""The partial algebra against a fresh aggregation: a base plus any sequence of differences
equals the partial of the values the cell holds now, and merging cells' partials equals the
partial of their union (hypothesis, random change sequences)."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.model.partials import (
    ExtremeState,
    SumState,
    _key,
    is_nan,
)

FLOATS = st.one_of(
    st.floats(-1e6, 1e6, allow_nan=False).map(lambda v: round(v, 2)),
    st.sampled_from([0.0, -0.0, 1.5, 2.5, math.nan, math.inf, -math.inf]),
    st.none(),
)
INTS = st.one_of(st.integers(-(10**12), 10**12), st.none())

# One change: ("insert", value), ("delete", index), ("update", index, value).
change = st.one_of(
    st.tuples(st.just("insert"), FLOATS),
    st.tuples(st.just("delete"), st.integers(0, 10**6)),
    st.tuples(st.just("update"), st.integers(0, 10**6), FLOATS),
)


def same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if is_nan(a) or is_nan(b):
        return is_nan(a) and is_nan(b)
    if isinstance(a, float) and math.isinf(a):
        return a == b
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)


def play(values: list, changes: list) -> list[tuple[list, list, list]]:
    """Apply `changes` to `values`; each step's (values after, entering, leaving)."""
    out = []
    current = list(values)
    for c in changes:
        entering, leaving = [], []
        if c[0] == "insert":
            current.append(c[1])
            entering = [c[1]]
        elif current and c[0] == "delete":
            leaving = [current.pop(c[1] % len(current))]
        elif current and c[0] == "update":
            i = c[1] % len(current)
            leaving, entering = [current[i]], [c[2]]
            current[i] = c[2]
        out.append((list(current), entering, leaving))
    return out


def prefix_of(values: list, largest: bool) -> list:
    return sorted((v for v in values if v is not None), key=_key, reverse=largest)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(FLOATS, max_size=12), changes=st.lists(change, max_size=25))
def test_a_sum_plus_its_differences_equals_a_fresh_sum(values, changes) -> None:
    state = SumState.of(values)
    for current, entering, leaving in play(values, changes):
        state = state.plus(SumState.of(entering)).plus(SumState.of(leaving), sign=-1)
        fresh = SumState.of(current)
        assert (state.n, state.nan, state.pinf, state.ninf) == (
            fresh.n,
            fresh.nan,
            fresh.pinf,
            fresh.ninf,
        )
        assert same(state.value, fresh.value)


@settings(max_examples=200, deadline=None)
@given(values=st.lists(INTS, max_size=12), changes=st.lists(change, max_size=25))
def test_an_integer_sum_plus_its_differences_is_exact(values, changes) -> None:
    ints = [
        c if c[0] == "delete" else (c[0], *c[1:-1], None if c[-1] is None else int(c[-1] or 0))
        for c in changes
        if not (c[0] != "delete" and isinstance(c[-1], float) and not math.isfinite(c[-1]))
    ]
    state = SumState.of(values)
    for current, entering, leaving in play(values, ints):
        state = state.plus(SumState.of(entering)).plus(SumState.of(leaving), sign=-1)
        assert state.value == SumState.of(current).value


@settings(max_examples=400, deadline=None)
@given(
    values=st.lists(FLOATS, max_size=14),
    changes=st.lists(change, max_size=30),
    largest=st.booleans(),
    k=st.integers(1, 5),
)
def test_an_extreme_keeps_an_exact_prefix_until_it_is_exhausted(values, changes, largest, k):
    state = ExtremeState.of(values, largest, k)
    refills = 0
    for current, entering, leaving in play(values, changes):
        state = state.apply(entering, leaving, k)
        truth = prefix_of(current, largest)
        assert state.n == len(truth)
        if state.exhausted:
            # Only when every known value left while others remain: aggregated again.
            refills += 1
            state = ExtremeState.of(current, largest, k)
            continue
        got = list(state.prefix)
        assert len(got) <= k
        assert [_key(v) for v in got] == [_key(v) for v in truth[: len(got)]]
        if state.n:
            assert same(state.value, truth[0])
        else:
            assert state.value is None
    assert refills <= len(changes)


@settings(max_examples=300, deadline=None)
@given(
    parts=st.lists(
        st.tuples(st.lists(FLOATS, max_size=8), st.lists(change, max_size=10)), max_size=5
    ),
    largest=st.booleans(),
    k=st.integers(1, 5),
)
def test_merging_cells_equals_the_extreme_of_their_union(parts, largest, k) -> None:
    states, union = [], []
    for values, changes in parts:
        state = ExtremeState.of(values, largest, k)
        current = list(values)
        for current, entering, leaving in play(values, changes):
            state = state.apply(entering, leaving, k)
            if state.exhausted:
                state = ExtremeState.of(current, largest, k)
        states.append(state)
        union += current
    merged = ExtremeState.merge(states, largest, k)
    truth = prefix_of(union, largest)
    assert merged.n == len(truth)
    if merged.exhausted:
        return
    got = list(merged.prefix)
    assert [_key(v) for v in got] == [_key(v) for v in truth[: len(got)]]
    # A merge of complete prefixes loses nothing.
    if all(s.complete for s in states):
        assert len(got) == min(k, len(truth))


def test_a_cell_whose_every_known_minimum_leaves_is_exhausted() -> None:
    state = ExtremeState.of([1.0, 2.0, 3.0, 4.0], largest=False, k=2)
    assert state.prefix == (1.0, 2.0) and not state.complete
    state = state.apply([], [1.0])
    assert state.value == 2.0 and not state.exhausted
    state = state.apply([], [2.0])
    assert state.exhausted and state.n == 2
    # A value entering above what is known cannot tell the minimum either.
    assert state.apply([9.0], []).exhausted


def test_an_update_to_a_smaller_value_keeps_the_prefix_full() -> None:
    state = ExtremeState.of([1.0, 2.0, 5.0, 6.0], largest=False, k=2)
    state = state.apply([1.5], [2.0])  # 2.0 corrected to 1.5
    assert state.prefix == (1.0, 1.5) and state.n == 4


def test_sums_follow_sql_and_spark_for_nulls_nan_and_infinities() -> None:
    assert SumState.of([None, None]).value is None
    assert SumState.of([1.0, None]).value == 1.0
    assert is_nan(SumState.of([1.0, math.nan]).value)
    assert is_nan(SumState.of([math.inf, -math.inf]).value)
    assert SumState.of([math.inf, 2.0]).value == math.inf
    back = SumState.of([1.0, math.nan]).plus(SumState.of([math.nan]), sign=-1)
    assert back.value == 1.0  # the NaN left: the sum is a number again


def test_a_maximum_orders_nan_above_every_number_as_spark_does() -> None:
    state = ExtremeState.of([1.0, math.nan, 3.0], largest=True)
    assert is_nan(state.value)
    assert ExtremeState.of([1.0, math.nan, 3.0], largest=False).value == 1.0
    assert state.apply([], [math.nan]).value == 3.0


def apply_one_by_one(state: ExtremeState, entering: list, leaving: list, k: int) -> ExtremeState:
    """The reference for `apply`'s entering values: each inserted and the prefix sorted again."""
    prefix, n = list(state.prefix), state.n
    for v in (x for x in entering if x is not None):
        if len(prefix) == n or (prefix and state._inside(prefix, v)):
            prefix = sorted([*prefix, v], key=_key, reverse=state.largest)
        n += 1
    rest = ExtremeState(state.largest, tuple(prefix), n).apply([], leaving, k=len(prefix) + 1)
    return ExtremeState(state.largest, rest.prefix[:k], rest.n)


@settings(max_examples=400, deadline=None)
@given(
    known=st.lists(FLOATS, max_size=10),
    unknown=st.integers(0, 5),
    entering=st.lists(FLOATS, max_size=10),
    leaving=st.lists(FLOATS, max_size=4),
    largest=st.booleans(),
    k=st.integers(1, 8),
)
def test_values_joining_a_prefix_at_once_land_as_joining_one_by_one(
    known, unknown, entering, leaving, largest, k
) -> None:
    prefix = tuple(prefix_of(known, largest))
    state = ExtremeState(largest, prefix, len(prefix) + (unknown if prefix else 0))
    got = state.apply(entering, leaving, k)
    want = apply_one_by_one(state, entering, leaving, k)
    assert got.n == want.n
    # Bit for bit: -0.0 and 0.0 keep the order they joined in.
    assert [repr(v) for v in got.prefix] == [repr(v) for v in want.prefix]
