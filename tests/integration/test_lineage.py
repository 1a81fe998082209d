"""Lineage of a value: after an ingest and a correction, a daily row traces to the correction's
job, run and generation, the hourly rows it read, and the raw commits behind them."""

import json

import pytest

from rollup_assets.cli import app as cli
from rollup_assets.model.errors import InvalidTimeRangeError, RowNotFoundError
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.services.lineage import lineage
from tests.conftest import World
from tests.integration.test_operator_controls import (
    DAILY,
    DAY_09,
    HOURLY,
    LATE_HOUR,
    NOW,
    build,
    cli_env,
    late_write,
    problems,
)


def test_a_daily_row_traces_to_the_correction_job_and_its_raw_commit(world: World) -> None:
    build(world, (HOURLY, DAILY))
    raw = world.catalog.archive("energy_raw")
    imported = world.engine.raw.table(raw).version()  # the build's one ingest
    late_write(world)  # a Manual correction of m1's readings in LATE_HOUR
    corrected = world.engine.raw.table(raw).version()
    world.tick(NOW)
    assert problems(world, (HOURLY, DAILY)) == []

    # Any instant inside the bucket names it.
    root = lineage(world.engine, DAILY, DAY_09.start.replace(hour=23), "m1")
    assert (root.rollup, root.bucket, root.entity) == (DAILY, DAY_09, "m1")
    assert root.job is not None and root.job.trigger is Trigger.CHAIN
    assert root.job.state is JobState.COMPLETED and root.job.source_archive == HOURLY
    assert root.generation == root.job.generation and root.generation > 0
    assert root.run_id is not None and root.run_id == root.job.run_id
    assert set(root.source_versions) == {HOURLY, f"{HOURLY}__genmap"}

    # The day reflects its 24 hourly rows as it read them; the corrected hour names the
    # correction's job (detected from the raw commit) and both raw commits behind it.
    assert [s.bucket.start for s in root.sources] == [
        DAY_09.start + i * (LATE_HOUR.end - LATE_HOUR.start) for i in range(24)
    ]
    [hour] = [s for s in root.sources if s.bucket == LATE_HOUR]
    assert hour.job is not None and hour.job.trigger is Trigger.PERIODIC
    assert hour.job.source_archive == "energy_raw" and hour.job.source_version == corrected
    # The day read the hourly level at (or after) the commit that flipped the corrected hour.
    assert root.job.source_version is not None
    assert root.source_versions[HOURLY] >= root.job.source_version
    assert hour.generation == hour.job.generation and hour.generation > 0
    assert hour.source_versions == {"energy_raw": corrected}
    assert [(c.version, c.rows) for c in hour.commits] == [(imported, 4), (corrected, 4)]
    fix = hour.commits[-1]
    assert fix.operation == "MERGE" and fix.committed_at is not None
    assert fix.metadata["rollups.change_source"] == "Manual"
    assert fix.metadata["rollups.operation"] == "ingest"
    # An hour the correction did not touch reflects the import only (both meters' rows: its
    # cell is m1's, so 4 rows), written by the backfill's generation.
    other = root.sources[0]
    assert [(c.version, c.rows) for c in other.commits] == [(imported, 4)]
    assert other.job is not None and other.job.job_id != hour.job.job_id

    with pytest.raises(RowNotFoundError, match="entity 'nope'"):
        lineage(world.engine, DAILY, DAY_09.start, "nope")
    with pytest.raises(InvalidTimeRangeError, match="before the first bucket"):
        lineage(world.engine, DAILY, DAY_09.start.replace(year=2000), "m1")

    with cli_env(world) as runner:
        args = ["lineage", DAILY, "--bucket", DAY_09.start.isoformat(), "--entity", "m1"]
        out = runner.invoke(cli.main, [*args, "--format", "json"])
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)
        assert rows[0]["level"] == 0 and rows[0]["job_id"] == root.job_id
        assert rows[0]["trigger"] == "ChainPropagation"
        raw_rows = [r for r in rows if r["level"] == 2 and r.get("version") == corrected]
        assert [(r["archive"], r["rows"], r["change_source"]) for r in raw_rows] == [
            ("energy_raw", 4, "Manual")
        ]
        out = runner.invoke(cli.main, [*args])
        assert out.exit_code == 0 and root.job_id in out.output
        out = runner.invoke(cli.main, ["lineage", DAILY, "--bucket", "yesterday", "--entity", "m1"])
        assert out.exit_code == 2 and "--bucket" in out.output
        out = runner.invoke(cli.main, [*args[:-1], "nope"])
        assert out.exit_code == 2 and "no row of entity 'nope'" in out.output
