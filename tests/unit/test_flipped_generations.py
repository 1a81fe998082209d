"""What a reclaim may never delete: every generation a job of the rollup flipped, however long
ago. A correction older than the generation retention whose rows a newer flip superseded is
still what a rollback of that newer flip gives back (R3 of the reliability review): an age limit
here lost them at the next recompute's reclaim."""

from datetime import UTC, datetime, timedelta

from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import DEFAULT_SPECS


def test_a_generation_flipped_longer_ago_than_the_retention_is_still_flipped(tmp_path) -> None:
    engine = Engine(
        load_catalog(path=DEFAULT_SPECS),
        Warehouse(str(tmp_path)),
        generation_retention=timedelta(days=7),
    )
    spec = engine.catalog.rollup("energy_hourly")
    t = datetime(2025, 6, 2, tzinfo=UTC)
    window = (Window(t, t + timedelta(hours=1)),)
    long_ago = datetime.now(UTC) - timedelta(days=30)

    def job(generation: int, state: JobState, at: datetime, processed: int = 1) -> Job:
        return Job(
            spec.name,
            Trigger.PERIODIC,
            window,
            state=state,
            generation=generation,
            windows_processed=processed,
            created_at=at,
            started_at=at,
            finished_at=at if state.terminal else None,
        )

    engine.ledger.record(
        [
            job(1, JobState.COMPLETED, long_ago),  # a month old: still flipped
            job(2, JobState.COMPLETED, datetime.now(UTC)),
            job(3, JobState.SWAPPING, datetime.now(UTC)),  # died after its flip, before its record
            job(4, JobState.FAILED, long_ago),  # never flipped
            job(5, JobState.COMPLETED, long_ago, processed=0),  # found nothing to change
        ]
    )
    assert engine.flipped_generations(spec) == frozenset({1, 2, 3})
