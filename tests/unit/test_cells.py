"""Cells: work kept per bucket, unions instead of cross products, and what a recompute writes."""

import pickle
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.model.bucketing import storage_partition
from rollup_assets.model.cells import (
    FOLD_MIN_POINTERS,
    CellCounts,
    Cells,
    buckets_to_fold,
    changed_cells,
    rewrites_whole,
)
from rollup_assets.model.jobs import Job, Trigger
from rollup_assets.model.placement import cells_of, job_scope
from rollup_assets.model.propagation import propagation_jobs
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.resources.ledger import decode_cells, encode_cells
from tests.unit.planning import activated

CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")
H = timedelta(hours=1)
T0 = datetime(2025, 3, 3, tzinfo=UTC)  # a Monday; Vienna is UTC+1


def hour(i: int) -> Window:
    return Window(T0 + i * H, T0 + (i + 1) * H)


def test_pairs_become_cells_per_bucket_never_a_cross_product() -> None:
    cells = Cells.from_pairs([(hour(3), "a"), (hour(90), "b"), (hour(3), "c")])
    assert cells == Cells(((hour(3), frozenset({"a", "c"})), (hour(90), frozenset({"b"}))))
    assert cells.named == 3 and cells.entities == frozenset({"a", "b", "c"})
    # An unnamed entity, or more than the limit, makes the bucket every entity's.
    assert Cells.from_pairs([(hour(1), "a"), (hour(1), None)]).scope(hour(1)) is None
    assert Cells.from_pairs([(hour(1), e) for e in "abc"], limit=2).scope(hour(1)) is None


def test_union_is_per_bucket_and_every_entity_absorbs() -> None:
    a = Cells(((hour(1), frozenset({"a"})), (hour(2), frozenset({"a"}))))
    b = Cells(((hour(2), frozenset({"b"})), (hour(5), None)))
    assert a.union(b) == Cells(
        ((hour(1), frozenset({"a"})), (hour(2), frozenset({"a", "b"})), (hour(5), None))
    )
    assert a.union(Cells(((hour(1), None),))).scope(hour(1)) is None
    assert a.union(b, limit=1).scope(hour(2)) is None


def test_a_job_keeps_cells_only_when_narrower_than_its_cross_product() -> None:
    product = Cells.of([hour(1), hour(2)], frozenset({"a"}))
    assert job_scope(product) == ((hour(1), hour(2)), frozenset({"a"}), None)
    every = Cells.of([hour(1), hour(2)])
    assert job_scope(every) == ((hour(1), hour(2)), None, None)
    scattered = Cells(((hour(1), frozenset({"a"})), (hour(2), frozenset({"b"}))))
    _, entities, exact = job_scope(scattered)
    assert entities == frozenset({"a", "b"}) and exact == scattered
    # Past the job's entity limit the envelope says every entity; the cells stay exact.
    assert job_scope(scattered, entity_limit=1)[1:] == (None, scattered)


def test_cells_of_a_job_expand_spans_and_follow_its_windows() -> None:
    scattered = Cells(
        ((hour(1), frozenset({"a"})), (hour(2), frozenset({"a"})), (hour(7), frozenset({"b"})))
    )
    windows, entities, exact = job_scope(scattered)
    job = Job("energy_hourly", Trigger.PERIODIC, tuple(merge_windows(list(windows))), entities)
    job = Job(job.rollup, job.trigger, job.windows, job.entities, cells=exact)
    assert cells_of(HOURLY, job) == scattered
    # The ledger stores spans per scope; they come back as the same cells.
    stored = Job(
        job.rollup, job.trigger, job.windows, job.entities, cells=decode_cells(encode_cells(exact))
    )
    assert cells_of(HOURLY, stored) == scattered
    # A job narrowed to some of its windows covers only their cells.
    assert cells_of(HOURLY, job.next(windows=(hour(7),))) == Cells(((hour(7), frozenset({"b"})),))
    # Without cells: the cross product of windows and entities.
    plain = Job("energy_hourly", Trigger.MANUAL, (Window(hour(1).start, hour(3).end),), None)
    assert cells_of(HOURLY, plain) == Cells.of([hour(1), hour(2), hour(3)])


def test_propagation_lifts_each_cell_into_the_bucket_containing_it() -> None:
    states = activated(CATALOG, T0 + 30 * 24 * H)
    cells = Cells(((hour(0), frozenset({"a"})), (hour(30), frozenset({"b"})), (hour(31), None)))
    [daily] = propagation_jobs(CATALOG, HOURLY, cells, 7, states)
    assert daily.rollup == "energy_daily" and daily.source_version == 7
    vienna_day = timedelta(hours=23)  # Vienna's March 3 starts at 23:00 UTC on March 2
    day0 = Window(T0 - H, T0 + vienna_day)
    day1 = Window(day0.end, day0.end + 24 * H)
    assert cells_of(CATALOG.rollup("energy_daily"), daily) == Cells(
        ((day0, frozenset({"a"})), (day1, None))
    )


@pytest.mark.parametrize(
    ("scope", "counts", "whole"),
    [
        (None, CellCounts(10, 5), True),
        (None, CellCounts(10, 4), False),
        (None, CellCounts(10, 0), False),
        (frozenset({"a", "b"}), CellCounts(2, 2), False),
    ],
)
def test_a_bucket_is_rewritten_whole_only_for_every_entity_work_that_mostly_changed(
    scope: frozenset[str] | None, counts: CellCounts, whole: bool
) -> None:
    assert rewrites_whole(scope, counts) is whole


def test_a_recompute_writes_only_the_changed_cells() -> None:
    cells = Cells(((hour(1), None), (hour(2), None), (hour(3), frozenset({"a", "b"}))))
    counts = {hour(1): CellCounts(4, 3), hour(2): CellCounts(4, 1), hour(3): CellCounts(2, 0)}
    changed = changed_cells(cells, counts, {hour(2): frozenset({"c"})})
    assert changed == Cells(((hour(1), None), (hour(2), frozenset({"c"}))))


def test_a_folded_bucket_is_rewritten_whole_even_unchanged() -> None:
    """Folding replaces a bucket's cell pointers by one bucket pointer: every-entity work on it
    is written whole, changed or not; named work and empty buckets are not folded."""
    cells = Cells(((hour(1), None), (hour(2), None), (hour(3), frozenset({"a"}))))
    counts = {hour(1): CellCounts(4, 0), hour(2): CellCounts(4, 1), hour(3): CellCounts(1, 0)}
    folded = frozenset({hour(1), hour(3), hour(4)})
    changed = changed_cells(cells, counts, {hour(2): frozenset({"c"})}, folded)
    assert changed == Cells(((hour(1), None), (hour(2), frozenset({"c"}))))


def test_a_fold_writes_only_settled_buckets() -> None:
    """A fold changes the layout, never values: a folded bucket whose fresh partials differ
    from the stored ones (cells a rollback gave back an earlier generation) is left as it is,
    and nothing but folded buckets is written."""
    cells = Cells(((hour(1), None), (hour(2), None), (hour(3), None)))
    counts = {hour(1): CellCounts(4, 0), hour(2): CellCounts(4, 1), hour(3): CellCounts(4, 4)}
    folded = frozenset({hour(1), hour(2)})
    changed = changed_cells(cells, counts, {hour(2): frozenset({"c"})}, folded, settled_only=True)
    assert changed == Cells(((hour(1), None),))


names = st.sampled_from("abcdef")
pairs = st.lists(st.tuples(st.integers(0, 40).map(hour), st.one_of(st.none(), names)))


@settings(max_examples=60, deadline=None)
@given(pairs, pairs)
def test_union_covers_exactly_the_cells_of_both(left: list, right: list) -> None:
    """Every (bucket, entity) of either side is covered by the union, and nothing else is
    (a bucket covers every entity only if one side did, or the limit was passed)."""
    a, b = Cells.from_pairs(left, limit=4), Cells.from_pairs(right, limit=4)
    u = a.union(b, limit=4)
    assert set(u.windows) == set(a.windows) | set(b.windows)
    for w, scope in u:
        sides = [c.scope(w) for c in (a, b) if w in c.windows]
        if scope is not None:
            assert all(s is not None for s in sides)
            assert scope == frozenset().union(*sides)
        else:
            named = [s for s in sides if s is not None]
            assert len(named) < len(sides) or len(frozenset().union(*named)) > 4


def test_folding_counts_cell_pointers_per_storage_partition() -> None:
    catalog = load_catalog()
    hourly = catalog.rollup("energy_hourly")
    daily = catalog.rollup("energy_daily")

    def hour(day: int, h: int) -> Window:
        start = datetime(2025, 3, day, h, tzinfo=UTC)
        return Window(start, start + timedelta(hours=1))

    # Scattered corrections: one cell pointer per hour. Seven on March 3rd stay (below the
    # threshold), eight on March 4th (in eight different hours) are folded, every one of them.
    thin = {hour(3, h): 1 for h in range(FOLD_MIN_POINTERS - 1)}
    folded = {hour(4, h): 1 for h in range(FOLD_MIN_POINTERS)}
    dense = {hour(5, 0): FOLD_MIN_POINTERS, hour(5, 1): 0}  # one bucket alone reaches it
    counts = {**thin, **folded, **dense}
    got = buckets_to_fold(counts, lambda t: storage_partition(hourly, t))
    assert got == frozenset([*folded, hour(5, 0)])
    # What remains per partition is below the threshold, whatever came before.
    left: dict[Window, int] = {}
    for w, n in counts.items():
        if w not in got:
            part = storage_partition(hourly, w.start)
            left[part] = left.get(part, 0) + n
    assert all(n < FOLD_MIN_POINTERS for n in left.values())

    # Days are stored by UTC month: days of one month count together (a Vienna day starts at
    # 23:00 UTC the evening before, so March 1st local lies in February's partition).
    def day(d: int) -> Window:
        start = datetime(2025, 3, d, tzinfo=UTC) - timedelta(hours=1)
        return Window(start, start + timedelta(days=1))

    days = {day(d): 1 for d in range(1, FOLD_MIN_POINTERS + 2)}  # one in February, 8 in March
    got = buckets_to_fold(days, lambda t: storage_partition(daily, t))
    assert got == frozenset(days) - {day(1)}


def test_storage_partitions_match_the_tables_physical_partitioning() -> None:
    catalog = load_catalog()
    t = datetime(2025, 12, 31, 23, 30, tzinfo=UTC)
    assert storage_partition(catalog.rollup("energy_hourly"), t) == Window(
        datetime(2025, 12, 31, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert storage_partition(catalog.rollup("energy_daily"), t) == Window(
        datetime(2025, 12, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
    )
    for name in ("energy_weekly", "energy_monthly", "energy_yearly"):
        assert storage_partition(catalog.rollup(name), t) == Window(
            datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)
        )


def test_the_last_representable_partitions_end_at_the_last_instant() -> None:
    catalog = load_catalog()
    last = datetime.max.replace(tzinfo=UTC)
    for name in ("energy_hourly", "energy_daily", "energy_yearly"):
        part = storage_partition(catalog.rollup(name), datetime(9999, 12, 31, 23, tzinfo=UTC))
        assert part.end == last and part.start.year == 9999


def collect_by_join(items, limit):
    """The reference for `Cells.collect`: each scope joined to its bucket's union in turn."""
    merged: dict = {}
    for w, scope in items:
        if w not in merged:
            merged[w] = scope
        elif merged[w] is None or scope is None:
            merged[w] = None
        else:
            union = merged[w] | scope
            merged[w] = None if limit is not None and len(union) > limit else union
    return Cells(tuple(sorted(merged.items(), key=lambda item: item[0])))


@settings(max_examples=200, deadline=None)
@given(
    items=st.lists(
        st.tuples(
            st.integers(0, 4),
            st.one_of(st.none(), st.frozensets(st.sampled_from("abcdefg"), max_size=5)),
        ),
        max_size=20,
    ),
    limit=st.one_of(st.none(), st.integers(1, 6)),
)
def test_collect_grows_each_buckets_union_as_joining_in_turn_would(items, limit) -> None:
    pairs = [(Window(T0 + i * H, T0 + (i + 1) * H), scope) for i, scope in items]
    assert Cells.collect(pairs, limit) == collect_by_join(pairs, limit)


def test_cells_hash_once_as_their_buckets_do_and_travel_without_the_cached_hash() -> None:
    start = datetime(2025, 3, 30, tzinfo=UTC)
    buckets = [Window(start + timedelta(hours=i), start + timedelta(hours=i + 1)) for i in range(3)]
    cells = Cells(tuple((w, frozenset({f"m{i}"})) for i, w in enumerate(buckets)))
    assert hash(cells) == hash(cells.by_window) == hash(Cells(cells.by_window))
    assert {cells: 1}[Cells(cells.by_window)] == 1
    # A pickled copy (another process: another string hash) hashes afresh there.
    copy = pickle.loads(pickle.dumps(cells))
    assert copy == cells and "_hash" not in copy.__dict__
    assert hash(copy) == hash(cells)
