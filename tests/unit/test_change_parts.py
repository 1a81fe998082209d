"""A correction's parts: the source commits and first-level cells it applies, narrowed to the
buckets a run takes, kept through the ledger, and handed up the chain."""

from datetime import UTC, datetime, timedelta

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from rollup_assets.compute.arrow_types import TS
from rollup_assets.compute.folding import bucket_starts
from rollup_assets.model.bucketing import Bucketing
from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import ChangePart, Job, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.propagation import propagation_jobs
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.resources.commit_changes import COMMIT_VERSION
from rollup_assets.resources.ledger import _decoded_parts, _encoded_parts
from rollup_assets.services.correction import _keys, _parts_of

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
    assert bucket_starts(table["ts"], b) == [
        b.window_of(t0 + timedelta(minutes=m)).start for _, m, _ in rows
    ]
