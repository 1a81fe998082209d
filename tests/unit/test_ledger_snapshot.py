"""The ledger's snapshot folds only what appends added, and is always the fold of every row in
recording order: a reused `Ledger` agrees with a fresh one after every commit, including a commit
whose rows were recorded before rows an earlier commit holds."""

import random
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.resources import ledger as ledger_module
from rollup_assets.resources.ledger import Ledger, job_row
from rollup_assets.resources.warehouse import Warehouse

T0 = datetime(2026, 3, 1, tzinfo=UTC)
WINDOW = Window(T0, T0 + timedelta(hours=1))


def job(job_id: str, state: JobState, seq: int) -> Job:
    return Job("energy_hourly", Trigger.MANUAL, (WINDOW,), job_id=job_id, state=state, seq=seq)


def append(ledger: Ledger, jobs: list[Job], recorded_at: datetime) -> None:
    """Jobs recorded at `recorded_at` (as a writer whose clock reads that would record them)."""
    ledger.table.append([{**job_row(j), "recorded_at": recorded_at} for j in jobs])


def states(ledger: Ledger) -> dict[str, JobState]:
    return {job_id: j.state for job_id, j in ledger.snapshot().jobs.items()}


@pytest.fixture
def warehouse(tmp_path: Path) -> Warehouse:
    return Warehouse(str(tmp_path / "warehouse"))


def test_an_append_folds_only_its_own_rows(
    warehouse: Warehouse, monkeypatch: pytest.MonkeyPatch
) -> None:
    ledger = Ledger(warehouse)
    append(ledger, [job(f"j{i}", JobState.PENDING, 0) for i in range(5)], T0)
    assert states(ledger) == {f"j{i}": JobState.PENDING for i in range(5)}

    folded: list[int] = []
    in_order = ledger_module._in_order
    monkeypatch.setattr(
        ledger_module, "_in_order", lambda rows: folded.append(rows.num_rows) or in_order(rows)
    )
    append(ledger, [job("j1", JobState.RUNNING, 1)], T0 + timedelta(seconds=1))
    append(ledger, [job("j2", JobState.COMPLETED, 1)], T0 + timedelta(seconds=2))
    assert states(ledger) == {
        **{f"j{i}": JobState.PENDING for i in range(5)},
        "j1": JobState.RUNNING,
        "j2": JobState.COMPLETED,
    }
    assert folded == [2]  # the two appended rows, not the seven
    assert states(ledger) == states(Ledger(warehouse))


def test_rows_recorded_before_the_newest_folded_refold_the_whole_ledger(
    warehouse: Warehouse,
) -> None:
    ledger = Ledger(warehouse)
    # A writer records "pending" at :02, another "running" at :01 that commits after it: in
    # recording order the job was running, then pending again.
    append(ledger, [job("j", JobState.PENDING, 2)], T0 + timedelta(seconds=2))
    assert states(ledger) == {"j": JobState.PENDING}
    append(ledger, [job("j", JobState.RUNNING, 1)], T0 + timedelta(seconds=1))
    assert states(ledger) == {"j": JobState.PENDING} == states(Ledger(warehouse))


def test_a_reused_ledger_agrees_with_a_fresh_one_after_every_commit(warehouse: Warehouse) -> None:
    rng = random.Random(34)
    ledger = Ledger(warehouse)
    clock = T0
    order = [JobState.PENDING, JobState.RUNNING, JobState.SWAPPING, JobState.COMPLETED]
    for step in range(25):
        clock += timedelta(seconds=rng.choice([1, 1, 1, 0, -3]))  # ties and a clock behind
        jobs = [
            job(f"j{rng.randrange(6)}", rng.choice(order), step) for _ in range(rng.randint(1, 3))
        ]
        append(ledger, jobs, clock)
        if rng.random() < 0.2:
            ledger.record(cursors={"energy_raw": step}, tables={"energy_raw": "t1"})
        assert ledger.snapshot() == Ledger(warehouse).snapshot(), step
