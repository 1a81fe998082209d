"""Run tags: the UI shows what a person filters by, and hides the bookkeeping."""

from datetime import UTC, datetime

from rollup_assets.model.jobs import Lane, Trigger
from rollup_assets.orchestration.tags import TAG_HOST, TAG_NOW, RunIntent, tag

HIDDEN = ".dagster/"  # Dagster's UI does not list tags under this prefix
SHOWN = {"rollups/rollup", "rollups/lane", "rollups/trigger", "rollups/job_id"}


def test_a_sensor_run_shows_rollup_lane_trigger_and_job_only() -> None:
    intent = RunIntent(
        "energy_hourly",
        Lane.FORWARD,
        Trigger.FORWARD,
        job_id="abc",
        now=datetime(2025, 11, 15, 12, tzinfo=UTC),
        host="worker-1",
    )
    tags = intent.tags()
    assert {k for k in tags if not k.startswith(HIDDEN)} == SHOWN
    assert {tags[TAG_NOW], tags[TAG_HOST]} == {"2025-11-15T12:00:00Z", "worker-1"}
    assert RunIntent.from_tags(tags, "energy_hourly") == intent


def test_runs_tagged_before_the_bookkeeping_was_hidden_still_read() -> None:
    old = {"rollups/rollup": "energy_daily", "rollups/now": "2025-11-15T12:00:00Z",
           "rollups/host": "worker-1"}  # fmt: skip
    intent = RunIntent.from_tags(old, "energy_daily")
    assert intent.now == datetime(2025, 11, 15, 12, tzinfo=UTC)
    assert intent.host == "worker-1" and tag(old, TAG_HOST) == "worker-1"
