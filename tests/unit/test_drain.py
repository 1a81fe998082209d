"""Draining the ledger into recompute runs: coalescing, waiting, and recovering dead jobs."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from resources.control import ArchiveStatus
from resources.ledger import Job, JobState, Trigger
from resources.warehouse import Warehouse
from rollup_assets.engine import Engine
from rollup_assets.partitions import Window
from rollup_assets.specs import load_catalog
from sensors.drain import plan_drain

T0 = datetime(2025, 5, 1, tzinfo=UTC)
WATERMARK = datetime(2025, 5, 2, tzinfo=UTC)
H = timedelta(hours=1)


class FakeRuns:
    def __init__(self, runs: dict[str, list[tuple[str, bool]]] | None = None) -> None:
        self.runs = runs or {}

    def runs_of_job(self, job_id: str, owner: str | None = None) -> list[tuple[str, bool]]:
        launched = list(self.runs.get(job_id, []))
        if owner and all(run != owner for run, _ in launched):
            launched += self.runs.get(owner, [])  # keyed by run id: the owner's own status
        return launched


@pytest.fixture
def engine(tmp_path: Path) -> Engine:
    eng = Engine(load_catalog(), Warehouse(str(tmp_path / "wh")))
    for name in eng.catalog.names():
        eng.states.update(
            name,
            lambda s: replace(s, status=ArchiveStatus.ACTIVATED, watermark=WATERMARK),
            reason="test",
        )
    return eng


def hours(*offsets: int) -> tuple[Window, ...]:
    return tuple(Window(T0 + o * H, T0 + (o + 1) * H) for o in offsets)


def plan(engine: Engine, runs: FakeRuns | None = None):
    p = plan_drain(engine, engine.states.all(), engine.ledger.snapshot(), runs or FakeRuns())
    engine.ledger.record(p.events)
    return p


def test_a_single_ready_job_is_launched_as_is(engine: Engine) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(1, 2), entities=frozenset({"m1"}))
    engine.ledger.record([job])
    p = plan(engine)
    assert [(lch.rollup, lch.job_id, lch.buckets) for lch in p.launches] == [
        ("energy_hourly", job.job_id, list(hours(1, 2)))
    ]
    assert p.events == []


def test_overlapping_jobs_coalesce_into_one_run(engine: Engine) -> None:
    a = Job("energy_hourly", Trigger.PERIODIC, hours(1, 2), entities=frozenset({"m1"}))
    b = Job("energy_hourly", Trigger.PERIODIC, hours(2, 3), entities=frozenset({"m2"}))
    engine.ledger.record([a, b])
    p = plan(engine)
    assert len(p.launches) == 1
    merged = engine.ledger.job(p.launches[0].job_id)
    assert merged is not None and merged.state is JobState.PENDING
    assert p.launches[0].buckets == list(hours(1, 2, 3)) and merged.entities == frozenset(
        {"m1", "m2"}
    )
    for old in (a, b):
        recorded = engine.ledger.job(old.job_id)
        assert recorded is not None and recorded.state is JobState.COALESCED
        assert recorded.coalesced_into == merged.job_id


def test_one_scope_for_all_entities_wins(engine: Engine) -> None:
    engine.ledger.record(
        [
            Job("energy_hourly", Trigger.PERIODIC, hours(1), entities=frozenset({"m1"})),
            Job("energy_hourly", Trigger.CHAIN, hours(5), entities=None),
        ]
    )
    merged = engine.ledger.job(plan(engine).launches[0].job_id)
    assert merged is not None and merged.entities is None


def test_buckets_past_the_watermark_wait(engine: Engine) -> None:
    late = Window(WATERMARK, WATERMARK + H)
    job = Job("energy_hourly", Trigger.PERIODIC, (*hours(3), late))
    engine.ledger.record([job])
    p = plan(engine)
    assert p.launches[0].buckets == list(hours(3))
    rest = engine.ledger.job(job.job_id)
    assert rest is not None and rest.state is JobState.PENDING and list(rest.windows) == [late]
    engine.states.update(
        "energy_hourly", lambda s: replace(s, watermark=WATERMARK + 2 * H), reason="forward"
    )
    engine.ledger.record([engine.ledger.job(p.launches[0].job_id).next(state=JobState.COMPLETED)])
    assert plan(engine).launches[0].buckets == [late]


def test_frozen_buckets_wait_until_unfreeze(engine: Engine) -> None:
    engine.states.update(
        "energy_hourly", lambda s: replace(s, frozen_until=T0 + 10 * H), reason="freeze"
    )
    job = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    engine.ledger.record([job])
    assert plan(engine).launches == []
    assert engine.ledger.job(job.job_id).state is JobState.PENDING
    engine.states.update(
        "energy_hourly", lambda s: replace(s, frozen_until=None), reason="unfreeze"
    )
    assert [lch.job_id for lch in plan(engine).launches] == [job.job_id]


def test_nothing_drains_for_a_rollup_that_is_not_activated(engine: Engine) -> None:
    engine.states.update(
        "energy_daily", lambda s: replace(s, status=ArchiveStatus.DISABLED), reason="disable"
    )
    engine.ledger.record(
        [
            Job(
                "energy_daily",
                Trigger.CHAIN,
                (Window(T0 - timedelta(days=3), T0 - timedelta(days=2)),),
            )
        ]
    )
    p = plan(engine)
    assert p.launches == [] and any("wait" in n for n in p.notes)


def test_one_recompute_at_a_time(engine: Engine) -> None:
    running = Job("energy_hourly", Trigger.PERIODIC, hours(1), state=JobState.RUNNING)
    waiting = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    engine.ledger.record([running, waiting])
    assert plan(engine, FakeRuns({running.job_id: [("run-1", False)]})).launches == []


def test_a_job_taken_over_by_a_live_run_keeps_its_rollup_busy(engine: Engine) -> None:
    # Chain propagation inside a run: no run was launched for the job; its owner is alive.
    chained = Job(
        "energy_hourly", Trigger.CHAIN, hours(1), state=JobState.RUNNING, run_id="owner-1"
    )
    waiting = Job("energy_hourly", Trigger.PERIODIC, hours(2))
    engine.ledger.record([chained, waiting])
    assert plan(engine, FakeRuns({"owner-1": [("owner-1", False)]})).launches == []
    assert engine.ledger.job(chained.job_id).state is JobState.RUNNING
    # Once the owner is gone without completing it, the job is failed and queued again.
    p = plan(engine, FakeRuns({"owner-1": [("owner-1", True)]}))
    assert engine.ledger.job(chained.job_id).state is JobState.FAILED
    assert len(p.launches) == 1 and p.launches[0].buckets == list(hours(1, 2))


def test_a_dead_job_is_failed_and_queued_again(engine: Engine) -> None:
    dead = Job(
        "energy_hourly",
        Trigger.PERIODIC,
        hours(4),
        state=JobState.RUNNING,
        entities=frozenset({"m9"}),
    )
    engine.ledger.record([dead])
    p = plan(engine, FakeRuns({dead.job_id: [("run-1", True)]}))
    assert engine.ledger.job(dead.job_id).state is JobState.FAILED
    assert len(p.launches) == 1
    retry = engine.ledger.job(p.launches[0].job_id)
    assert (
        retry.job_id != dead.job_id
        and list(retry.windows) == list(hours(4))
        and retry.entities == frozenset({"m9"})
    )


def test_a_manual_request_entirely_past_the_watermark_is_a_completed_no_op(engine: Engine) -> None:
    job = Job("energy_hourly", Trigger.MANUAL, (Window(WATERMARK, WATERMARK + 3 * H),))
    engine.ledger.record([job])
    assert plan(engine).launches == []
    done = engine.ledger.job(job.job_id)
    assert done.state is JobState.COMPLETED and done.windows_processed == 0


def test_a_job_that_died_after_its_flip_is_completed_and_propagated(engine: Engine) -> None:
    job = Job("energy_hourly", Trigger.PERIODIC, hours(2), state=JobState.SWAPPING, generation=1)
    engine.rollups.flip(
        engine.catalog.rollup("energy_hourly"),
        list(hours(2)),
        None,
        1,
        job_id=job.job_id,
        run_id="r1",
    )
    engine.ledger.record([job])
    p = plan(engine, FakeRuns({job.job_id: [("r1", True)]}))
    done = engine.ledger.job(job.job_id)
    assert done.state is JobState.COMPLETED and "recovery" in (done.error or "")
    assert [s.job_id for s in p.sweeps] == [job.job_id]
    daily = [
        j for j in engine.ledger.snapshot().for_rollup("energy_daily") if j.trigger is Trigger.CHAIN
    ]
    assert len(daily) == 1 and daily[0].state is JobState.PENDING


def days(*offsets: int) -> tuple[Window, ...]:
    return tuple(Window(T0 + o * 24 * H, T0 + (o + 1) * 24 * H) for o in offsets)


def test_chain_jobs_wait_for_the_run_that_carries_them(engine: Engine) -> None:
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
    engine.ledger.record([carried, chained])
    waiting = plan(engine, FakeRuns({"run-1": [("run-1", False)]}))
    assert waiting.launches == []
    assert any("carries the chain" in n for n in waiting.notes), waiting.notes
    # The run ended without taking the job: the next tick launches it.
    ended = plan(engine, FakeRuns({"run-1": [("run-1", True)]}))
    assert [lch.rollup for lch in ended.launches] == ["energy_daily"]


def test_other_work_on_the_level_is_not_held_back_by_a_carrying_run(engine: Engine) -> None:
    carried = Job(
        "energy_hourly", Trigger.PERIODIC, hours(1), state=JobState.RUNNING, run_id="run-1"
    )
    chained = Job("energy_daily", Trigger.CHAIN, days(0))
    manual = Job("energy_daily", Trigger.MANUAL, days(0))
    engine.ledger.record([carried, chained, manual])
    p = plan(engine, FakeRuns({"run-1": [("run-1", False)]}))
    assert [lch.rollup for lch in p.launches] == ["energy_daily"]
