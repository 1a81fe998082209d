"""The publish planner: which lagging surfaces one run publishes at a given instant, so that a
stream of flips coalesces into few publishes and a publish is never asked for twice."""

from datetime import UTC, datetime, timedelta

from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.sensors.surface_plan import plan_publish, spacing, state_of
from rollup_assets.services.surface_lag import NEUTRAL_SLACK, SurfaceLag

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
MAX_LAG = timedelta(seconds=60)
RECORDED = Reflected(3, 7)


def lag(name: str, ago: float | None, recorded: Reflected | None = RECORDED) -> SurfaceLag:
    """`name`'s surface, lagging since `ago` seconds before NOW (None: current)."""
    since = None if ago is None else NOW - timedelta(seconds=ago)
    return SurfaceLag(name, recorded, since)


def plan(lags, in_flight=frozenset(), launched=None, attempts=None, now=NOW):
    return plan_publish(lags, set(in_flight), launched or {}, attempts or {}, now, MAX_LAG)


def test_a_lagging_surface_is_published_at_once_and_current_ones_are_left() -> None:
    p = plan([lag("hourly", 2.0), lag("daily", None)])
    assert p.rollups == ("hourly",)
    assert p.run_key is not None and p.run_key.startswith("surface:")
    assert p.launched == {"hourly": NOW.timestamp()}
    assert plan([lag("daily", None)]).rollups == ()


def test_every_level_due_at_one_tick_is_published_by_one_run() -> None:
    p = plan([lag(n, 1.0) for n in ("yearly", "hourly", "daily")])
    assert p.rollups == ("daily", "hourly", "yearly")


def test_a_rollup_is_published_at_most_once_per_half_the_lag_bound() -> None:
    assert spacing(MAX_LAG) == timedelta(seconds=30)
    just = {"hourly": NOW.timestamp() - 29}
    waiting = plan([lag("hourly", 25.0)], launched=just)
    assert waiting.rollups == () and waiting.launched == just
    assert "spacing 30 s" in waiting.notes[0]
    later = plan([lag("hourly", 25.0)], launched={"hourly": NOW.timestamp() - 30})
    assert later.rollups == ("hourly",)
    # With no bound to keep, every tick that finds a lag publishes it.
    every = plan_publish([lag("hourly", 0.1)], set(), just, {}, NOW, timedelta(0))
    assert every.rollups == ("hourly",)


def test_a_rollup_whose_publish_is_in_flight_waits_for_it() -> None:
    p = plan([lag("hourly", 5.0), lag("daily", 5.0)], in_flight={"hourly"})
    assert p.rollups == ("daily",)
    assert plan([lag("hourly", 5.0)], in_flight={"*"}).rollups == ()  # a run of every rollup


def test_the_same_states_get_the_same_key_and_a_failed_publish_its_next_attempt() -> None:
    lags = [lag("hourly", 5.0), lag("daily", 3.0)]
    first = plan(lags)
    again = plan(lags)  # a tick evaluated again from the same cursor
    assert again.run_key == first.run_key
    retry = plan(lags, launched=first.launched, attempts=first.attempts, now=NOW + MAX_LAG)
    assert retry.rollups == first.rollups
    assert retry.run_key != first.run_key and retry.run_key.endswith(":2")
    # Once published (another state), the attempts of the old state are forgotten.
    moved = [lag("hourly", 1.0, Reflected(4, 9)), lag("daily", None)]
    nxt = plan(moved, launched=retry.launched, attempts=retry.attempts, now=NOW + 2 * MAX_LAG)
    assert nxt.run_key is not None and nxt.run_key.endswith(":1")
    assert set(nxt.attempts) == {state_of(moved[0])}


def test_a_missing_surface_or_one_far_behind_by_neutral_commits_is_published() -> None:
    unknown = SurfaceLag("hourly", None, None, unknown=True)
    assert unknown.needs_publish and unknown.seconds(NOW) is None
    assert plan([unknown]).rollups == ("hourly",)
    neutral = SurfaceLag("daily", Reflected(1, 1), None, behind=NEUTRAL_SLACK + 1)
    assert neutral.needs_publish and neutral.seconds(NOW) == 0.0
    assert not SurfaceLag("daily", Reflected(1, 1), None, behind=NEUTRAL_SLACK).needs_publish
    assert lag("weekly", 12.5).seconds(NOW) == 12.5


def test_a_surface_waits_for_the_work_under_way_within_the_spacing() -> None:
    """A correction carried up the chain flips one level after another: while work is queued or
    running, a publish waits for it (coalescing the levels it is about to flip, and leaving the
    machine to it) until the oldest unpublished change is as old as the spacing."""
    young, old = lag("hourly", 5.0), lag("daily", 30.0)
    waiting = plan_publish([young, old], set(), {}, {}, NOW, MAX_LAG, working=True)
    assert waiting.rollups == ("daily",)
    assert "hourly: waits for the work queued, running or about to start" in waiting.notes[0]
    assert plan_publish([young], set(), {}, {}, NOW, MAX_LAG, working=False).rollups == ("hourly",)
    # A surface whose recorded versions are gone has no change time to wait on.
    unknown = SurfaceLag("weekly", None, None, unknown=True)
    assert plan_publish([unknown], set(), {}, {}, NOW, MAX_LAG, working=True).rollups == ("weekly",)
    # With no bound to keep there is no spacing to wait within.
    assert plan_publish([young], set(), {}, {}, NOW, timedelta(0), working=True).rollups == (
        "hourly",
    )
