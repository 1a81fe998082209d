"""Draining the ledger into recompute runs: coalescing, waiting, and recovering dead jobs."""

from collections.abc import Collection
from datetime import UTC, datetime, timedelta

import pytest

from rollup_assets.model.cells import Cells
from rollup_assets.model.jobs import Job, JobState, Lane, RetryPolicy, Trigger
from rollup_assets.model.placement import cells_of
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows
from rollup_assets.sensors.drain import DrainPlan, plan_drain
from tests.unit.planning import MemoryLedger, activated, update

T0 = datetime(2025, 5, 1, tzinfo=UTC)
WATERMARK = datetime(2025, 5, 2, tzinfo=UTC)
H = timedelta(hours=1)
CATALOG = load_catalog()
HOURLY = CATALOG.rollup("energy_hourly")


class FakeRuns:
    def __init__(self, runs: dict[str, list[tuple[str, bool]]] | None = None) -> None:
        self.runs = runs or {}

    def runs_of_job(self, job_id: str, owner: str | None = None) -> list[tuple[str, bool]]:
        launched = list(self.runs.get(job_id, []))
        if owner and all(run != owner for run, _ in launched):
            launched += self.runs.get(owner, [])  # keyed by run id: the owner's own status
        return launched


class DrainState:
    """Archive states and the ledger, in memory."""

    def __init__(self) -> None:
        self.states = activated(CATALOG, WATERMARK)
        self.ledger = MemoryLedger()


@pytest.fixture
def drain() -> DrainState:
    return DrainState()


def hours(*offsets: int) -> tuple[Window, ...]:
    return tuple(Window(T0 + o * H, T0 + (o + 1) * H) for o in offsets)


# Retries start at once here; the backoff has tests of its own.
AT_ONCE = RetryPolicy(attempts=3, backoff=timedelta(0))


def plan(
    drain: DrainState,
    runs: FakeRuns | None = None,
    flipped: Collection[str] = frozenset(),
    policy: RetryPolicy = AT_ONCE,
    now: datetime | None = None,
) -> DrainPlan:
    """One drain tick, its events recorded in the ledger as the sensor records them."""
    p = plan_drain(
        CATALOG,
        drain.states,
        drain.ledger.snapshot(),
        runs or FakeRuns(),
        dict.fromkeys(flipped),
        policy=policy,
        now=now or datetime.now(UTC),
    )
    drain.ledger.record(p.events)
    return p


def test_a_single_ready_job_is_launched_as_is(drain: DrainState) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(1, 2), entities=frozenset({"m1"}))
    drain.ledger.record([job])
    p = plan(drain)
    assert [(lch.rollup, lch.job_id, lch.buckets) for lch in p.launches] == [
        ("energy_hourly", job.job_id, list(hours(1, 2)))
    ]
    assert p.events == []


def test_overlapping_jobs_coalesce_into_one_run(drain: DrainState) -> None:
    a = Job("energy_hourly", Trigger.PERIODIC, hours(1, 2), entities=frozenset({"m1"}))
    b = Job("energy_hourly", Trigger.PERIODIC, hours(2, 3), entities=frozenset({"m2"}))
    drain.ledger.record([a, b])
    p = plan(drain)
    assert len(p.launches) == 1
    merged = drain.ledger.job(p.launches[0].job_id)
    assert merged is not None and merged.state is JobState.PENDING
    assert p.launches[0].buckets == list(hours(1, 2, 3)) and merged.entities == frozenset(
        {"m1", "m2"}
    )
    # The union of their cells, not every hour for both meters.
    m1, m2 = frozenset({"m1"}), frozenset({"m2"})
    h1, h2, h3 = hours(1, 2, 3)
    assert cells_of(HOURLY, merged) == Cells(((h1, m1), (h2, m1 | m2), (h3, m2)))
    for old in (a, b):
        recorded = drain.ledger.job(old.job_id)
        assert recorded is not None and recorded.state is JobState.COALESCED
        assert recorded.coalesced_into == merged.job_id


def test_a_fold_is_never_merged_with_work_that_aggregates_or_corrects(drain: DrainState) -> None:
    """A fold rewrites what is visible and only in the buckets it may fold: merged into it, a
    recompute (a new formula's, say) or a correction would be dropped. A run takes one kind:
    source aggregation first, then corrections, folds last."""
    fold = Job("energy_hourly", Trigger.MAINTENANCE, hours(1, 2))
    formula = Job("energy_hourly", Trigger.PERIODIC, hours(0, 1, 2, 3, 4))
    drain.ledger.record([fold, formula])
    p = plan(drain)
    assert [lch.job_id for lch in p.launches] == [formula.job_id]
    waiting = drain.ledger.job(fold.job_id)
    assert waiting is not None and waiting.state is JobState.PENDING
    drain.ledger.record([formula.next(state=JobState.COMPLETED)])
    assert [lch.job_id for lch in plan(drain).launches] == [fold.job_id]


def test_one_scope_for_all_entities_wins(drain: DrainState) -> None:
    drain.ledger.record(
        [
            Job("energy_hourly", Trigger.PERIODIC, hours(1), entities=frozenset({"m1"})),
            Job("energy_hourly", Trigger.CHAIN, hours(5), entities=None),
        ]
    )
    merged = drain.ledger.job(plan(drain).launches[0].job_id)
    assert merged is not None and merged.entities is None
    # ... for the bucket it covers; the other keeps its one entity.
    h1, h5 = hours(1, 5)
    assert cells_of(HOURLY, merged) == Cells(((h1, frozenset({"m1"})), (h5, None)))


def test_buckets_past_the_watermark_wait(drain: DrainState) -> None:
    late = Window(WATERMARK, WATERMARK + H)
    job = Job("energy_hourly", Trigger.PERIODIC, (*hours(3), late))
    drain.ledger.record([job])
    p = plan(drain)
    assert p.launches[0].buckets == list(hours(3))
    rest = drain.ledger.job(job.job_id)
    assert rest is not None and rest.state is JobState.PENDING and list(rest.windows) == [late]
    update(drain.states, "energy_hourly", watermark=WATERMARK + 2 * H)
    drain.ledger.record([drain.ledger.job(p.launches[0].job_id).next(state=JobState.COMPLETED)])
    assert plan(drain).launches[0].buckets == [late]


def test_frozen_buckets_wait_until_unfreeze(drain: DrainState) -> None:
    update(drain.states, "energy_hourly", frozen_until=T0 + 10 * H)
    job = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    drain.ledger.record([job])
    assert plan(drain).launches == []
    assert drain.ledger.job(job.job_id).state is JobState.PENDING
    update(drain.states, "energy_hourly", frozen_until=None)
    assert [lch.job_id for lch in plan(drain).launches] == [job.job_id]


@pytest.mark.parametrize("status", [ArchiveStatus.DISABLED, ArchiveStatus.FAILED])
def test_nothing_drains_for_a_rollup_that_is_not_activated(
    drain: DrainState, status: ArchiveStatus
) -> None:
    update(drain.states, "energy_daily", status=status)
    drain.ledger.record(
        [
            Job(
                "energy_daily",
                Trigger.CHAIN,
                (Window(T0 - timedelta(days=3), T0 - timedelta(days=2)),),
            )
        ]
    )
    p = plan(drain)
    assert p.launches == [] and any("wait" in n and status.value in n for n in p.notes)


def test_one_recompute_at_a_time(drain: DrainState) -> None:
    running = Job("energy_hourly", Trigger.PERIODIC, hours(1), state=JobState.RUNNING)
    waiting = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    drain.ledger.record([running, waiting])
    assert plan(drain, FakeRuns({running.job_id: [("run-1", False)]})).launches == []


def test_a_job_taken_over_by_a_live_run_keeps_its_rollup_busy(drain: DrainState) -> None:
    # Chain propagation inside a run: no run was launched for the job; its owner is alive.
    chained = Job(
        "energy_hourly", Trigger.CHAIN, hours(1), state=JobState.RUNNING, run_id="owner-1"
    )
    waiting = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    drain.ledger.record([chained, waiting])
    assert plan(drain, FakeRuns({"owner-1": [("owner-1", False)]})).launches == []
    assert drain.ledger.job(chained.job_id).state is JobState.RUNNING
    # Once the owner is gone without completing it, the job is failed and queued again.
    p = plan(drain, FakeRuns({"owner-1": [("owner-1", True)]}))
    assert drain.ledger.job(chained.job_id).state is JobState.FAILED
    assert len(p.launches) == 1 and p.launches[0].buckets == list(hours(1, 2))


def test_a_dead_job_is_failed_and_queued_again(drain: DrainState) -> None:
    dead = Job(
        "energy_hourly",
        Trigger.PERIODIC,
        hours(4),
        state=JobState.RUNNING,
        entities=frozenset({"m9"}),
    )
    drain.ledger.record([dead])
    p = plan(drain, FakeRuns({dead.job_id: [("run-1", True)]}))
    assert drain.ledger.job(dead.job_id).state is JobState.FAILED
    assert len(p.launches) == 1
    retry = drain.ledger.job(p.launches[0].job_id)
    assert (
        retry.job_id != dead.job_id
        and list(retry.windows) == list(hours(4))
        and retry.entities == frozenset({"m9"})
    )


def test_a_manual_request_entirely_past_the_watermark_is_a_completed_no_op(
    drain: DrainState,
) -> None:
    job = Job("energy_hourly", Trigger.MANUAL, (Window(WATERMARK, WATERMARK + 3 * H),))
    drain.ledger.record([job])
    assert plan(drain).launches == []
    done = drain.ledger.job(job.job_id)
    assert done.state is JobState.COMPLETED and done.windows_processed == 0


def test_a_job_that_died_after_its_flip_is_completed_and_propagated(drain: DrainState) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(2), state=JobState.SWAPPING, generation=1)
    drain.ledger.record([job])
    p = plan(drain, FakeRuns({job.job_id: [("r1", True)]}), flipped={job.job_id})
    done = drain.ledger.job(job.job_id)
    assert done.state is JobState.COMPLETED and "recovery" in (done.error or "")
    assert done.windows_processed == 1
    assert [s.job_id for s in p.sweeps] == [job.job_id]
    daily = [
        j for j in drain.ledger.snapshot().for_rollup("energy_daily") if j.trigger is Trigger.CHAIN
    ]
    assert len(daily) == 1 and daily[0].state is JobState.PENDING
    # The level above drains what the recovery queued in the same tick; nothing is redone below.
    assert [(lch.rollup, lch.job_id) for lch in p.launches] == [("energy_daily", daily[0].job_id)]


def test_a_job_that_died_swapping_before_its_flip_is_failed_and_queued_again(
    drain: DrainState,
) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(2), state=JobState.SWAPPING, generation=1)
    drain.ledger.record([job])
    p = plan(drain, FakeRuns({job.job_id: [("r1", True)]}), flipped={"another-job"})
    failed = drain.ledger.job(job.job_id)
    assert failed.state is JobState.FAILED and "r1" in (failed.error or "")
    assert p.sweeps == []
    assert [j for j in drain.ledger.snapshot().jobs.values() if j.rollup != "energy_hourly"] == []
    [launch] = p.launches
    retry = drain.ledger.job(launch.job_id)
    assert (launch.rollup, launch.lane, launch.buckets) == (
        "energy_hourly",
        Lane.RECOMPUTE,
        list(hours(2)),
    )
    assert retry.job_id != job.job_id and retry.state is JobState.PENDING


def days(*offsets: int) -> tuple[Window, ...]:
    return tuple(Window(T0 + o * 24 * H, T0 + (o + 1) * 24 * H) for o in offsets)


def test_chain_jobs_wait_for_the_run_that_carries_them(drain: DrainState) -> None:
    # The run writing the source level completed its job and is still in flight: it carries the
    # chain to the daily level itself, so the sensor launches nothing there meanwhile.
    carried = Job(
        "energy_hourly",
        Trigger.PERIODIC,
        hours(1),
        state=JobState.COMPLETED,
        run_id="run-1",
        started_at=T0,
        finished_at=T0,
    )
    chained = Job("energy_daily", Trigger.CHAIN, days(0))
    drain.ledger.record([carried, chained])
    waiting = plan(drain, FakeRuns({"run-1": [("run-1", False)]}))
    assert waiting.launches == []
    assert any("carries the chain" in n for n in waiting.notes), waiting.notes
    # The run ended without taking the job: the next tick launches it.
    ended = plan(drain, FakeRuns({"run-1": [("run-1", True)]}))
    assert [lch.rollup for lch in ended.launches] == ["energy_daily"]


def test_other_work_on_the_level_is_not_held_back_by_a_carrying_run(drain: DrainState) -> None:
    carried = Job(
        "energy_hourly", Trigger.PERIODIC, hours(1), state=JobState.RUNNING, run_id="run-1"
    )
    chained = Job("energy_daily", Trigger.CHAIN, days(0))
    manual = Job("energy_daily", Trigger.MANUAL, days(0))
    drain.ledger.record([carried, chained, manual])
    p = plan(drain, FakeRuns({"run-1": [("run-1", False)]}))
    assert [lch.rollup for lch in p.launches] == ["energy_daily"]


def test_a_job_over_buckets_a_refresh_below_aggregates_again_waits_for_it(
    drain: DrainState,
) -> None:
    """A run of a day reads hours a refresh aggregates again: it waits for the refresh
    (`Trigger.REFRESH`), pending or running; a day the refresh does not touch does not wait."""
    refresh = Job("energy_hourly", Trigger.REFRESH, hours(1), entities=frozenset({"m1"}))
    above = Job("energy_daily", Trigger.MANUAL, days(0))
    elsewhere = Job("energy_daily", Trigger.MANUAL, days(-2))
    drain.ledger.record([refresh, above, elsewhere])
    first = plan(drain)
    assert sorted((lch.rollup, lch.job_id) for lch in first.launches) == sorted(
        [("energy_hourly", refresh.job_id), ("energy_daily", elsewhere.job_id)]
    )
    assert "energy_daily: 1 pending job(s) wait for a refresh" in first.notes
    drain.ledger.record([refresh.next(state=JobState.RUNNING, run_id="run-1")])
    drain.ledger.record([elsewhere.next(state=JobState.COMPLETED)])
    assert plan(drain, FakeRuns({"run-1": [("run-1", False)]})).launches == []
    drain.ledger.record([refresh.next(state=JobState.COMPLETED)])
    assert [(lch.rollup, lch.job_id) for lch in plan(drain).launches] == [
        ("energy_daily", above.job_id)
    ]


def test_work_merged_with_a_refresh_is_a_refresh(drain: DrainState) -> None:
    """A refresh merged into older work of its rollup still holds back what reads its cells:
    the merged job is a refresh too."""
    older = Job("energy_hourly", Trigger.CHAIN, hours(1, 2))
    refresh = Job("energy_hourly", Trigger.REFRESH, hours(2), entities=frozenset({"m1"}))
    drain.ledger.record([older, refresh])
    [launch] = plan(drain).launches
    assert launch.trigger is Trigger.REFRESH
    held = drain.ledger.snapshot().refreshing("energy_hourly")
    assert merge_windows(held) == merge_windows(list(hours(1, 2)))


def test_a_fold_waits_for_a_refresh_of_its_rollup_in_its_backoff(drain: DrainState) -> None:
    """A fold over a cell whose refresh failed and waits out its backoff would meet the cell
    again and queue another refresh, without a backoff: it waits."""
    now = datetime.now(UTC)
    refresh = Job(
        "energy_hourly", Trigger.REFRESH, hours(1), attempt=2, not_before=now + timedelta(hours=1)
    )
    fold = Job("energy_hourly", Trigger.MAINTENANCE, hours(1, 2))
    elsewhere = Job("energy_hourly", Trigger.MAINTENANCE, hours(5))
    drain.ledger.record([refresh, fold, elsewhere])
    p = plan(drain, now=now)
    assert [lch.job_id for lch in p.launches] == [elsewhere.job_id]
    assert "energy_hourly: 1 pending job(s) wait for a refresh" in p.notes


def test_a_retry_waits_out_its_backoff_then_runs(drain: DrainState) -> None:
    dead = Job("energy_hourly", Trigger.PERIODIC, hours(4), state=JobState.RUNNING)
    drain.ledger.record([dead])
    policy = RetryPolicy(attempts=3, backoff=timedelta(seconds=30))
    died = datetime(2026, 1, 1, tzinfo=UTC)
    p = plan(drain, FakeRuns({dead.job_id: [("run-1", True)]}), policy=policy, now=died)
    assert p.launches == [] and any("backoff" in n for n in p.notes)
    [retry] = drain.ledger.snapshot().pending("energy_hourly")
    assert retry.attempt == 2 and retry.not_before == died + timedelta(seconds=30)
    assert plan(drain, policy=policy, now=died + timedelta(seconds=29)).launches == []
    [launch] = plan(drain, policy=policy, now=died + timedelta(seconds=30)).launches
    assert launch.job_id == retry.job_id


def test_work_that_keeps_dying_is_given_up_after_its_last_attempt(drain: DrainState) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(4), entities=frozenset({"m1"}))
    drain.ledger.record([job])
    runs = FakeRuns()
    for attempt in range(1, AT_ONCE.attempts + 1):
        [launch] = plan(drain, runs).launches
        current = drain.ledger.job(launch.job_id)
        assert current.attempt == attempt
        drain.ledger.record([current.next(state=JobState.RUNNING)])
        runs.runs[launch.job_id] = [(f"run-{attempt}", True)]  # the run died
    assert plan(drain, runs).launches == []
    assert drain.ledger.snapshot().pending("energy_hourly") == []
    last = drain.ledger.job(launch.job_id)
    assert last.state is JobState.FAILED and last.gave_up
    assert (last.error or "").startswith(f"gave up after {AT_ONCE.attempts} attempt(s)")
