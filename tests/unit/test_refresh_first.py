"""A job that meets cells it cannot know waits behind their refresh, a bounded number of times."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

from rollup_assets.model.jobs import Job, JobState, RetryPolicy, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_reads import CellsUnknowable
from rollup_assets.services.recompute_work import refresh_first

DAY = Window(datetime(2025, 5, 1, 22, tzinfo=UTC), datetime(2025, 5, 2, 22, tzinfo=UTC))
HOUR = datetime(2025, 5, 2, 9, tzinfo=UTC)


class Engine:
    """What `refresh_first` reads of the engine."""

    catalog = load_catalog()
    retry = RetryPolicy(attempts=3, backoff=timedelta(0))


def test_a_job_waits_behind_a_refresh_of_the_cells_then_gives_up_after_its_last_attempt() -> None:
    running = Job("energy_daily", Trigger.MANUAL, (DAY,), frozenset({"m1"}), JobState.RUNNING)
    unknown = CellsUnknowable("energy_hourly", [("m1", HOUR)])
    refresh, again, done = refresh_first(Engine(), running, unknown)  # type: ignore[arg-type]
    assert (refresh.rollup, refresh.trigger, refresh.state) == (
        "energy_hourly",
        Trigger.REFRESH,
        JobState.PENDING,
    )
    assert refresh.windows == (Window(HOUR, HOUR + timedelta(hours=1)),)
    assert refresh.entities == frozenset({"m1"})
    assert (again.trigger, again.state, again.attempt, again.windows) == (
        Trigger.MANUAL,
        JobState.PENDING,
        2,
        (DAY,),
    )
    assert (done.job_id, done.state, done.windows_processed) == (
        running.job_id,
        JobState.COMPLETED,
        0,
    )
    assert "waits for a refresh: 'energy_hourly': 1 cell(s)" in (done.plan or "")
    # The cells stay unknown however often they are refreshed: the last attempt gives up.
    [failed] = refresh_first(Engine(), replace(running, attempt=3), unknown)  # type: ignore[arg-type]
    assert (failed.state, failed.gave_up) == (JobState.FAILED, True)
    assert (failed.error or "").startswith("gave up after 3 attempt(s): 'energy_hourly'")
