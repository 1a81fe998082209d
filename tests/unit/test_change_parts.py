"""A correction's parts: the source commits and first-level cells it applies, narrowed to the
buckets a run takes, kept through the ledger, and handed up the chain."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.folding import RowCells, bucket_bounds
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangePart, Job, JobState, LedgerSnapshot, Trigger
from rollup_assets.model.placement import buckets_in, buckets_of_each
from rollup_assets.model.propagation import completed_after_flip, propagation_jobs
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import Alignment
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, micros
from rollup_assets.resources.commit_changes import COMMIT_VERSION
from rollup_assets.resources.ledger import _decoded_parts, _encoded_parts
from rollup_assets.services.correction import (
    Absorbed,
    _keys,
    _not_absorbed,
    _parts_of,
    _rows_of,
    _within,
)

CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")
T0 = datetime(2025, 8, 13, 22, tzinfo=UTC)  # a Vienna day starts
H = timedelta(hours=1)


def hours(first: int, n: int) -> list[Window]:
    return [Window(T0 + (first + i) * H, T0 + (first + i + 1) * H) for i in range(n)]


def part(pairs: list[tuple[Window, str]], commit: int = 7) -> ChangePart:
    return ChangePart((commit,), Cells.from_pairs(pairs, 64))


def test_a_part_narrowed_to_some_buckets_keeps_the_cells_inside_them() -> None:
    p = part([(w, "m1") for w in hours(0, 24)] + [(w, "m2") for w in hours(5, 2)])
    # The ledger stores runs of buckets as spans; narrowing cuts the spans.
    p = _decoded_parts(_encoded_parts((p,)))[0]
    narrowed = p.within(hours(4, 3))
    assert _keys(narrowed, HOURLY) == (
        set(),
        {(w.start, "m1") for w in hours(4, 3)} | {(w.start, "m2") for w in hours(5, 2)},
    )
    assert not p.within(hours(30, 2)).cells
    # Narrowed to buckets of a level above (the day), every cell of the day stays.
    day = Window(T0, T0 + 24 * H)
    assert _keys(p.within([day]), HOURLY) == _keys(p, HOURLY)
    # Inside one span whole, the part is kept as it is; across two, cut to them.
    assert p.within([day]) is p and p.within(hours(0, 30)) is p
    ends = p.within(hours(0, 2) + hours(22, 2))
    assert _keys(ends, HOURLY) == (set(), {(w.start, "m1") for w in hours(0, 2) + hours(22, 2)})
    assert not p.within([]).cells


def test_parts_survive_the_ledger_with_their_version_seen_above() -> None:
    parts = (
        part([(w, "m1") for w in hours(0, 3)], commit=3),
        ChangePart((4, 5), Cells.of(hours(10, 2)), seen_at=12),
    )
    back = _decoded_parts(_encoded_parts(parts))
    assert [(p.commits, p.seen_at) for p in back] == [((3,), None), ((4, 5), 12)]
    assert [_keys(p, HOURLY) for p in back] == [_keys(p, HOURLY) for p in parts]
    assert _keys(back[1], HOURLY)[0] == {w.start for w in hours(10, 2)}


def test_a_job_narrowed_to_its_ready_buckets_narrows_its_parts() -> None:
    p = part([(w, "m1") for w in hours(0, 6)])
    job = Job("energy_hourly", Trigger.PERIODIC, tuple(hours(0, 6)), parts=(p,))
    assert job.corrects
    ready = job.narrowed(tuple(hours(0, 2)))
    assert ready.windows == tuple(hours(0, 2))
    assert _keys(ready.parts[0], HOURLY)[1] == {(w.start, "m1") for w in hours(0, 2)}
    # Jobs that aggregate again carry no parts.
    assert (
        Job("energy_hourly", Trigger.PERIODIC, tuple(hours(0, 2)))
        .narrowed(tuple(hours(0, 1)))
        .parts
        is None
    )


def test_a_fold_whose_flip_landed_queues_nothing_above_however_it_is_completed() -> None:
    """A fold (maintenance) changes no value: completed by its own run or after a crash, a
    failure or a disable, it queues nothing for the levels above; a recompute queues them."""
    states = {
        "energy_daily": ArchiveState(
            "energy_daily", status=ArchiveStatus.ACTIVATED, watermark=T0 + 48 * H
        )
    }
    windows = tuple(hours(1, 2))
    fold = Job(HOURLY.name, Trigger.MAINTENANCE, windows, entities=None, state=JobState.SWAPPING)
    [done] = completed_after_flip(CATALOG, HOURLY, fold, states, "died after its flip")
    assert done.state is JobState.COMPLETED
    recompute = Job(HOURLY.name, Trigger.PERIODIC, windows, entities=None, state=JobState.SWAPPING)
    [_, up] = completed_after_flip(CATALOG, HOURLY, recompute, states, "died after its flip")
    assert up.rollup == "energy_daily" and up.trigger is Trigger.CHAIN


def test_a_correction_goes_up_the_chain_as_a_correction_of_the_same_changes() -> None:
    p = ChangePart((9,), Cells.from_pairs([(w, "m1") for w in hours(1, 2)], 64), seen_at=40)
    states = {
        "energy_daily": ArchiveState(
            "energy_daily", status=ArchiveStatus.ACTIVATED, watermark=T0 + 48 * H
        )
    }
    changed = Cells.from_pairs([(w, "m1") for w in hours(1, 2)], 64)
    [up] = propagation_jobs(CATALOG, HOURLY, changed, 40, states, parts=(p,))
    assert up.rollup == "energy_daily" and up.trigger is Trigger.CHAIN and up.corrects
    assert [(q.commits, q.seen_at) for q in up.parts] == [((9,), 40)]
    assert buckets_in(CATALOG.rollup("energy_daily"), list(up.windows)) == [Window(T0, T0 + 24 * H)]
    # A level that aggregated again: the levels above aggregate again too.
    [again] = propagation_jobs(CATALOG, HOURLY, changed, 40, states)
    assert not again.corrects


@settings(max_examples=60, deadline=None)
@given(
    rows=st.lists(
        st.tuples(
            st.sampled_from(["m1", "m2", "m3"]),
            st.integers(0, 3 * 24 * 60),
            st.sampled_from([4, 7, 9]),
        ),
        max_size=40,
    )
)
def test_the_parts_of_change_rows_are_their_commits_first_level_cells(rows) -> None:
    # From a night before the autumn DST switch in Vienna: hours of 23 and 25 h days alike.
    t0 = datetime(2025, 10, 25, 20, tzinfo=UTC)
    table = pa.table(
        {
            "entity_id": pa.array([e for e, _, _ in rows], pa.string()),
            "ts": pa.array([t0 + timedelta(minutes=m) for _, m, _ in rows], TS),
            COMMIT_VERSION: pa.array([c for _, _, c in rows], pa.int64()),
        }
    )
    b = Bucketing.of(HOURLY)
    by_commit: dict = {}
    for e, m, c in rows:
        by_commit.setdefault(c, []).append((b.window_of(t0 + timedelta(minutes=m)), frozenset([e])))
    want = tuple(
        ChangePart((c,), Cells.collect(items, limit=None)) for c, items in sorted(by_commit.items())
    )
    assert _parts_of(table, HOURLY, "ts") == want
    cells = RowCells.of(table, "ts", b)
    assert [cells.cells[i] for i in cells.index.tolist()] == [
        (b.window_of(t0 + timedelta(minutes=m)).start, e) for e, m, _ in rows
    ]


# The grouped questions a correction asks of its change rows (which part a row belongs to,
# whether a newer aggregation holds it, whether its cell is ready) against the same questions
# asked row by row.
DST_NIGHT = datetime(2025, 10, 25, 20, tzinfo=UTC)  # before the autumn switch in Vienna
ORIGIN = datetime(2025, 11, 2, 1, 7, tzinfo=UTC)
ENTITIES = ["m1", "m2", "m3"]


def change_rows(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table(
        {
            "entity_id": pa.array([e for e, _, _ in rows], pa.string()),
            "ts": pa.array([DST_NIGHT + timedelta(minutes=m) for _, m, _ in rows], TS),
            COMMIT_VERSION: pa.array([c for _, _, c in rows], pa.int64()),
        }
    )


def scoped_cells(picks: list[tuple[int, int | None]], level) -> Cells:
    """Cells of `level` from (bucket number from DST_NIGHT's, entity index or None: all)."""
    b = Bucketing.of(level)
    windows = [b.window_of(DST_NIGHT)]
    while windows[-1].end <= DST_NIGHT + timedelta(days=3):  # the rows' span
        windows.append(b.window_of(windows[-1].end))
    out = []
    for n, e in picks:
        out.append((windows[n % len(windows)], None if e is None else frozenset([ENTITIES[e]])))
    return Cells.collect(out, limit=None)


row_lists = st.lists(
    st.tuples(st.sampled_from(ENTITIES), st.integers(0, 3 * 24 * 60), st.sampled_from([4, 7, 9])),
    max_size=40,
)
cell_picks = st.lists(st.tuples(st.integers(0, 79), st.one_of(st.none(), st.integers(0, 2))))


def rows_of_row_by_row(table: pa.Table, parts, root) -> tuple[list[int], list[int]]:
    b = Bucketing.of(root)
    kept, seen = [], []
    columns = (table["entity_id"], table["ts"], table[COMMIT_VERSION])
    for i, (e, t, c) in enumerate(zip(*(x.to_pylist() for x in columns), strict=True)):
        start = b.window_of(t).start
        for p in parts:
            whole, named = _keys(p, root)
            if c in p.commits and (start in whole or (start, e) in named):
                kept.append(i)
                seen.append(c if p.seen_at is None else p.seen_at)
                break
    return kept, seen


@settings(max_examples=60, deadline=None)
@given(
    rows=row_lists,
    parts=st.lists(
        st.tuples(
            st.lists(st.sampled_from([4, 7, 9]), min_size=1, max_size=2),
            cell_picks,
            st.one_of(st.none(), st.integers(10, 20)),
        ),
        max_size=3,
    ),
)
def test_the_rows_of_parts_grouped_are_the_rows_of_parts_row_by_row(rows, parts) -> None:
    table = change_rows(rows).append_column("n", pa.array(range(len(rows)), pa.int64()))
    made = [ChangePart(tuple(c), scoped_cells(p, HOURLY), seen) for c, p, seen in parts]
    # A row in two parts counts from the first (as the row-by-row reference does).
    made.append(ChangePart((4, 9), scoped_cells([(n, None) for n in range(80)], HOURLY), 30))
    made.insert(0, ChangePart((4, 7, 9), scoped_cells([(3, None), (40, 1)], HOURLY), 31))
    kept, seen = _rows_of(table, made, HOURLY, "ts")
    want_kept, want_seen = rows_of_row_by_row(table, made, HOURLY)
    assert kept["n"].to_pylist() == want_kept
    assert seen.tolist() == want_seen


@settings(max_examples=60, deadline=None)
@given(
    rows=row_lists,
    buckets=st.lists(st.tuples(st.integers(0, 79), st.sampled_from([0, 4, 5, 7, 9, 12]))),
    cells=st.lists(
        st.tuples(st.integers(0, 79), st.integers(0, 2), st.sampled_from([0, 4, 5, 7, 9, 12]))
    ),
    level=st.sampled_from(["energy_hourly", "energy_daily"]),
)
def test_what_a_newer_aggregation_holds_grouped_is_what_it_holds_row_by_row(
    rows, buckets, cells, level
) -> None:
    spec = CATALOG.rollup(level)
    b = Bucketing.of(spec)
    at = scoped_cells([(n, None) for n, _ in buckets], spec).windows
    absorbed = Absorbed(
        {w.start: v for w, (_, v) in zip(at, buckets, strict=False)},
        {
            (w.start, ENTITIES[e]): v
            for (n, e, v) in cells
            for w in scoped_cells([(n, None)], spec).windows
        },
    )
    table = change_rows(rows).append_column("n", pa.array(range(len(rows)), pa.int64()))
    seen = np.array([c for _, _, c in rows], dtype=np.int64)
    new = _not_absorbed(RowCells.of(table, "ts", b), seen, absorbed)
    kept, skipped = table.filter(pa.array(new)), int((~new).sum())
    want = [
        i
        for i, (e, t) in enumerate(
            zip(table["entity_id"].to_pylist(), table["ts"].to_pylist(), strict=True)
        )
        if seen[i] > absorbed.version(b.window_of(t).start, e)
    ]
    assert kept["n"].to_pylist() == want
    assert skipped == len(rows) - len(want)


@settings(max_examples=60, deadline=None)
@given(
    rows=row_lists.filter(bool),
    jobs=st.lists(
        st.tuples(cell_picks, st.sampled_from([2, 4, 5, 7, 9, 12]), st.booleans()), max_size=6
    ),
    level=st.sampled_from(["energy_hourly", "energy_daily"]),
)
def test_aggregations_that_read_before_every_change_are_left_out_of_what_is_absorbed(
    rows, jobs, level
) -> None:
    """A correction reads only the aggregations that read a source version at or after its
    earliest change (`newer_than`); which rows are new is the same as with every aggregation."""
    spec = CATALOG.rollup(level)
    ledger = {}
    for i, (picks, version, completed) in enumerate(jobs):
        cells = scoped_cells(picks, spec)
        job = Job(
            spec.name,
            Trigger.FORWARD,
            cells.windows,
            state=JobState.COMPLETED if completed else JobState.FAILED,
            read_version=version,
            created_at=T0 + i * H,
            cells=cells,
        )
        ledger[job.job_id] = job
    snapshot = LedgerSnapshot(ledger, {})
    table = change_rows(rows)
    seen = np.array([c for _, _, c in rows], dtype=np.int64)
    cells = RowCells.of(table, "ts", Bucketing.of(spec))
    every = _not_absorbed(cells, seen, Absorbed.of(snapshot, spec))
    floored = Absorbed.of(snapshot, spec, newer_than=int(seen.min()) - 1)
    assert _not_absorbed(cells, seen, floored).tolist() == every.tolist()
    older = {w.start for j in ledger.values() if j.read_version < seen.min() for w in j.windows}
    assert not older & (set(floored.buckets) | {s for s, _ in floored.cells}) - {
        w.start for j in ledger.values() if j.read_version >= seen.min() for w in j.windows
    }


@settings(max_examples=60, deadline=None)
@given(rows=row_lists, picks=cell_picks, level=st.sampled_from(["energy_hourly", "energy_daily"]))
def test_the_rows_in_ready_cells_grouped_are_those_row_by_row(rows, picks, level) -> None:
    spec = CATALOG.rollup(level)
    b = Bucketing.of(spec)
    ready = scoped_cells(picks, spec)
    table = change_rows(rows).append_column("n", pa.array(range(len(rows)), pa.int64()))
    want = []
    pairs = zip(table["entity_id"].to_pylist(), table["ts"].to_pylist(), strict=True)
    for i, (e, t) in enumerate(pairs):
        w = b.window_of(t)
        if any(x.start == w.start and (scope is None or e in scope) for x, scope in ready):
            want.append(i)
    within = _within(RowCells.of(table, "ts", b), ready)
    assert table.filter(pa.array(within))["n"].to_pylist() == want


@settings(max_examples=60, deadline=None)
@given(
    minutes=st.lists(st.integers(-3 * 24 * 60, 400 * 24 * 60), max_size=30),
    level=st.sampled_from(
        ["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "5h from an origin"]
    ),
)
def test_bucket_bounds_are_each_instants_window(minutes, level) -> None:
    # Instants on and between bucket boundaries, over both DST switches and a year end; fixed
    # sizes counted from an origin amid them (instants before it too).
    b = (
        Bucketing(Alignment.FIXED_SIZE, ZoneInfo("Europe/Vienna"), timedelta(hours=5), ORIGIN)
        if level == "5h from an origin"
        else Bucketing.of(CATALOG.rollup(level))
    )
    times = [DST_NIGHT + timedelta(minutes=15 * (m // 15)) for m in minutes]
    starts, ends = bucket_bounds(pa.array(times, TS), b)
    windows = [b.window_of(t) for t in times]
    assert starts.tolist() == [micros(w.start) for w in windows]
    assert ends.tolist() == [micros(w.end) for w in windows]


@settings(max_examples=40, deadline=None)
@given(
    spans=st.lists(
        st.tuples(st.integers(-3 * 24 * 4, 400 * 24 * 4), st.integers(0, 40 * 24 * 4)), max_size=12
    ),
    level=st.sampled_from(["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly"]),
)
def test_the_buckets_of_each_span_are_buckets_in_it_alone(spans, level) -> None:
    spec = CATALOG.rollup(level)
    windows = [
        Window(DST_NIGHT + timedelta(minutes=15 * a), DST_NIGHT + timedelta(minutes=15 * (a + n)))
        for a, n in spans
    ]
    assert buckets_of_each(spec, windows) == [buckets_in(spec, [w]) for w in windows]
