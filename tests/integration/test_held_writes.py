"""Held writes: late writes into a frozen range are listed (CLI, status, the asset's health
observation), not applied while frozen, and applied on unfreeze up the chain (oracle)."""

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow.parquet as pq

from rollup_assets.cli import app as cli
from rollup_assets.model.jobs import ChangeSource, JobState, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.tenancy import NO_TENANT
from rollup_assets.resources.delta_tables import read_commit
from rollup_assets.sensors.definitions import _health_events
from rollup_assets.services.health import health
from rollup_assets.services.held import held_writes
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.preview import preview_ingest
from tests.conftest import World
from tests.integration.test_operator_controls import (
    DAILY,
    DAY_09,
    DAY_10,
    HOURLY,
    LATE_HOUR,
    NOW,
    build,
    cli_env,
    problems,
    readings,
    stored_rows,
)

H = timedelta(hours=1)


def commit_info(world: World, rollup: str, version: int) -> dict:
    """The commit info of pointer-table version `version` of `rollup`."""
    uri = world.engine.rollups.genmap_uri(world.catalog.rollup(rollup))
    actions = read_commit(uri, version, world.engine.rollups.options)
    return next(a["commitInfo"] for a in actions if "commitInfo" in a)


NOON = Window(DAY_09.start + 14 * H, DAY_09.start + 15 * H)  # 2025-06-09 12:00-13:00 Vienna


def test_writes_into_a_frozen_range_are_held_listed_and_applied_on_unfreeze(
    world: World, tmp_path: Path
) -> None:
    levels = (HOURLY, DAILY)
    build(world, levels)
    world.ops.freeze(HOURLY, DAY_10.start)  # every hour of 2025-06-09 (local) is frozen
    world.ops.freeze(DAILY, DAY_10.start)
    hourly_before = stored_rows(world, HOURLY, DAY_10.start)

    # Two late writes (each reading replaces a stored one): four of m1, then eight of both meters.
    late = tmp_path / "late.parquet"
    pq.write_table(readings(LATE_HOUR.start, LATE_HOUR.end, 3.0, meters=("m1",)), late)
    # The preview says the write will be held, at both levels.
    p = preview_ingest(world.engine, "energy_raw", late)
    assert {(c.rollup, c.held) for c in p.cells} == {(HOURLY, True), (DAILY, True)}
    assert [(w.rollup, w.held_cells) for w in p.work] == [(HOURLY, 1), (DAILY, 1)]
    v1 = ingest_file(world.engine, "energy_raw", late, ChangeSource.MANUAL).version
    v2 = world.ingest(readings(NOON.start, NOON.end, 5.0), source="Import")
    world.tick(NOW)

    held = held_writes(world.engine, HOURLY)
    assert [(h.source_archive, h.source_version, h.rows) for h in held] == [
        ("energy_raw", v1, 4),
        ("energy_raw", v2, 8),
    ]
    assert [(h.start, h.end, len(h.cells)) for h in held] == [
        (LATE_HOUR.start, LATE_HOUR.end, 1),
        (NOON.start, NOON.end, 1),
    ]
    assert held[0].cells.entities == frozenset({"m1"})
    assert held[1].cells.entities == frozenset({"m1", "m2"})
    # Not applied while frozen: the stored hours are as they were, and differ from the oracle.
    assert stored_rows(world, HOURLY, DAY_10.start) == hourly_before
    assert problems(world, (HOURLY,)) != []

    h = health(world.catalog, HOURLY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.held_writes == 2 and h.held_ranges == [LATE_HOUR, NOON]
    events, _ = _health_events(world.engine, {}, NO_TENANT)
    [observed] = [e for e in events if e.asset_key.path[-1] == HOURLY]
    assert observed.metadata["held_writes"].value == 2
    assert observed.metadata["held_ranges"].value == [str(LATE_HOUR), str(NOON)]

    with cli_env(world) as runner:
        out = runner.invoke(cli.main, ["held", HOURLY, "--format", "json"])
        assert out.exit_code == 0, out.output
        rows = json.loads(out.output)
        assert [(r["source_version"], r["rows"], r["buckets"]) for r in rows] == [
            (v1, 4, 1),
            (v2, 8, 1),
        ]
        assert rows[0]["change_source"] == "Manual" and rows[1]["cells"] == "2 in 1 bucket(s)"
        out = runner.invoke(cli.main, ["status", HOURLY, "--format", "json"])
        assert out.exit_code == 0, out.output
        [status] = json.loads(out.output)
        assert status["held_writes"] == 2 and status["held_ranges"] == f"{LATE_HOUR}, {NOON}"
        out = runner.invoke(cli.main, ["held", "no_such_rollup"])
        assert out.exit_code == 2 and "no_such_rollup" in out.output

    # Unfreeze the hourly level: its held writes are applied; the daily level, still frozen,
    # now holds the hourly level's change (the commit that flipped the corrected hours).
    thawed = datetime.now(UTC)
    state = world.ops.unfreeze(HOURLY)
    assert state.accept_gaps is False
    assert world.engine.states.history(HOURLY)[-1].reason == (
        "unfreeze (accept_gaps=false); released 2 held write(s)"
    )
    world.tick(NOW)
    assert held_writes(world.engine, HOURLY) == []
    assert problems(world, (HOURLY,)) == []
    [up] = held_writes(world.engine, DAILY)
    assert up.job.trigger is Trigger.CHAIN and up.source_archive == HOURLY
    # The hourly version it names is the flip that showed the held writes' differences.
    assert up.source_version is not None
    info = commit_info(world, HOURLY, up.source_version)
    assert info["rollups.operation"] == "flip"
    applied = world.engine.ledger.job(info["rollups.job_id"])
    assert applied is not None and applied.rollup == HOURLY
    # The held writes' jobs corrected the three cells (m1@10, m1@12, m2@12) between them.
    released = [
        j
        for j in world.engine.ledger.history(HOURLY)
        if (j.finished_at or j.created_at) >= thawed
        and j.state is JobState.COMPLETED
        and j.cells_changed
    ]
    assert applied.job_id in {j.job_id for j in released}
    assert sum(j.cells_changed or 0 for j in released) == 3
    assert (up.start, up.end, up.rows) == (DAY_09.start, DAY_09.end, 3)  # m1@10, m1@12, m2@12
    assert problems(world, (DAILY,)) != []

    state = world.ops.unfreeze(DAILY, accept_gaps=True)
    assert state.accept_gaps is True
    assert world.engine.states.history(DAILY)[-1].reason == (
        "unfreeze (accept_gaps=true); released 1 held write(s)"
    )
    world.tick(NOW)
    assert held_writes(world.engine, DAILY) == []
    assert problems(world, levels) == []
    h = health(world.catalog, DAILY, world.engine.ledger.snapshot(), world.engine.states.all())
    assert h.held_writes == 0 and h.dirty_windows_pending == 0
