"""What a rollup run's materializations say: each partition names its job, generation and the
run's use of Spark; the last one (the asset's latest) carries all the run's figures."""

from datetime import UTC, datetime, timedelta

from rollup_assets.model.jobs import Job, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.assets import BRIEF, _materializations
from rollup_assets.orchestration.resources import SparkResource
from rollup_assets.orchestration.tenancy import NO_TENANT
from rollup_assets.services.run_outcome import RunOutcome

HOURLY = load_catalog().rollup("energy_hourly")
T0 = datetime(2025, 3, 3, tzinfo=UTC)  # 01:00 in the catalog's zone (Vienna)
H = timedelta(hours=1)


def test_scattered_partitions_each_say_the_brief_and_the_last_says_everything() -> None:
    hours = [Window(T0 + k * H, T0 + (k + 1) * H) for k in (0, 5, 49)]
    job = Job("energy_hourly", Trigger.PERIODIC, tuple(hours), job_id="j-1")
    outcome = RunOutcome(job, hours, rows=3, generation=4, version=9, duration_ms=12)
    events = list(_materializations(HOURLY, outcome, SparkResource(), NO_TENANT))

    assert [e.partition for e in events] == [
        "2025-03-03-01:00",
        "2025-03-03-06:00",
        "2025-03-05-02:00",
    ]
    *earlier, last = [e.metadata for e in events]
    assert all(set(m) == set(BRIEF) for m in earlier)
    assert set(BRIEF) < set(last) and {"windows", "rows", "duration_ms", "source_versions"} <= set(
        last
    )
    for m in [*earlier, last]:
        assert m["job_id"].value == "j-1" and m["generation"].value == 4
        assert m["trigger"].value == "Periodic" and m["table_version"].value == 9
    # The run's own figures (its rows, the Spark it used) are said once, on the last.
    assert all("rows" not in m and "spark" not in m for m in earlier)
    assert last["windows"].value == 3 and last["rows"].value == 3
    assert last["spark"].value == "not started"
