"""Impact preview: a dry run of an ingest lists the cells of every level it would change, with
old and new values and the work, writes nothing, and matches what the ingest then does."""

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollup_assets.cli import app as cli
from rollup_assets.demo.sample_data import SCHEMA
from rollup_assets.model.bucketing import first_bucket_start
from rollup_assets.model.errors import IngestValidationError
from rollup_assets.model.jobs import ChangeSource, Trigger
from rollup_assets.model.windows import Window
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.preview import preview_ingest
from tests.conftest import World
from tests.integration.test_operator_controls import (
    DAILY,
    DAY_09,
    HOURLY,
    LATE_HOUR,
    NOW,
    build,
    cli_env,
    problems,
    readings,
)

LEVELS = (HOURLY, DAILY)
NOON = Window(LATE_HOUR.start.replace(hour=12), LATE_HOUR.start.replace(hour=13))


def versions(world: World) -> dict[str, object]:
    """Every table version a write would move, and the ledger's and states' contents."""
    out: dict[str, object] = {
        "energy_raw": world.engine.raw.table(world.catalog.archive("energy_raw")).version(),
        "jobs": len(world.engine.ledger.snapshot().jobs),
        "states": [len(world.engine.states.history(n)) for n in ("energy_raw", *LEVELS)],
    }
    for name in LEVELS:
        snap = world.engine.rollups.snapshot(world.catalog.rollup(name))
        out[name] = (snap.version, snap.genmap_version)
    return out


def values(world: World, name: str) -> dict[tuple, dict]:
    """The rollup's closed buckets: (bucket_start, entity) -> logical values."""
    mark = world.engine.states.get(name).watermark
    out = {}
    for r in world.query(name).to_pylist():
        if r["bucket_end"] <= mark:
            key = (r.pop("bucket_start"), r.pop("entity_id"))
            r.pop("bucket_end")
            out[key] = r
    return out


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9)
    return a == b


def test_preview_matches_what_the_ingest_then_does_and_writes_nothing(
    world: World, tmp_path: Path
) -> None:
    build(world, LEVELS)
    late = readings(LATE_HOUR.start, LATE_HOUR.end, 3.0, meters=("m1",))  # 4 updates
    unchanged = readings(NOON.start, NOON.end)  # 8 rows equal to the stored ones
    new_meter = readings(LATE_HOUR.start, LATE_HOUR.start.replace(minute=15), meters=("m3",))
    forward = readings(NOW.replace(minute=15), NOW.replace(minute=30), 2.0, meters=("m1",))
    path = tmp_path / "correction.parquet"
    pq.write_table(pa.concat_tables([late, unchanged, new_meter, forward]).cast(SCHEMA), path)
    before = versions(world)
    stored = {name: values(world, name) for name in LEVELS}

    p = preview_ingest(world.engine, "energy_raw", path)
    assert (p.rows, p.inserted, p.updated, p.unchanged) == (14, 1, 5, 8)
    assert versions(world) == before  # nothing written

    by_level = {w.rollup: w for w in p.work}
    hourly, daily = by_level[HOURLY], by_level[DAILY]
    assert (hourly.level, hourly.cells, hourly.buckets, hourly.cells_changed) == (1, 2, 1, 2)
    # The cost model: the change rows are read (4 updates: before and after images, 1 insert)
    # and applied as differences, at every level; no stored cell and no source row is read for
    # it (the preview reads the stored cells only to show their old and new values).
    assert hourly.technique == "difference" and hourly.forward_rows == 1
    assert hourly.rows_to_read == 2 * 4 + 1
    assert "corrected from 9 change row(s) as differences" in hourly.reason
    assert (daily.level, daily.cells, daily.buckets, daily.cells_changed) == (2, 2, 1, 2)
    assert daily.technique == "difference" and daily.rows_to_read == 2 * 4 + 1
    assert {(c.rollup, c.bucket, c.entity) for c in p.cells} == {
        (HOURLY, LATE_HOUR, "m1"),
        (HOURLY, LATE_HOUR, "m3"),
        (DAILY, DAY_09, "m1"),
        (DAILY, DAY_09, "m3"),
    }
    for c in p.cells:
        assert not c.held
        old = stored[c.rollup].get((c.bucket.start, c.entity))
        assert c.old == old  # None for the new meter
    with cli_env(world) as runner:
        out = runner.invoke(cli.main, ["preview", "energy_raw", str(path), "--format", "json"])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.output)
        assert doc["updated"] == 5 and len(doc["cells"]) == 4
        assert [w["technique"] for w in doc["work"]] == ["difference", "difference"]
        out = runner.invoke(cli.main, ["preview", "energy_raw", str(path)])
        assert out.exit_code == 0 and "energy_daily" in out.output
        bad = tmp_path / "bad.csv"
        bad.write_text("entity_id,ts,energy_kwh,power_kw,voltage_v\nm1,not-a-time,1,2,3\n")
        out = runner.invoke(cli.main, ["preview", "energy_raw", str(bad)])
        assert out.exit_code == 2 and "energy_raw" in out.output
    with pytest.raises(IngestValidationError):
        preview_ingest(world.engine, "energy_raw", bad)
    assert versions(world) == before

    ingested = datetime.now(UTC)
    ingest_file(world.engine, "energy_raw", path, ChangeSource.MANUAL)
    world.tick(NOW)
    assert problems(world, LEVELS) == []
    for name in LEVELS:
        after = values(world, name)
        changed = {
            k
            for k, v in after.items()
            if k not in stored[name] or any(not same(v[c], stored[name][k][c]) for c in v)
        }
        previewed = [c for c in p.cells if c.rollup == name]
        assert changed == {(c.bucket.start, c.entity) for c in previewed}, name
        for c in previewed:
            now = after[(c.bucket.start, c.entity)]
            assert all(same(now[k], v) for k, v in c.new.items()), (c, now)
        jobs = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= ingested
            and j.trigger in (Trigger.PERIODIC, Trigger.CHAIN)
            and j.technique
        ]
        work = by_level[name]
        assert jobs and {j.technique for j in jobs} == {work.technique}
        assert sum((j.change_rows or 0) + (j.source_rows or 0) for j in jobs) == work.rows_to_read
        assert sum(j.cells_changed or 0 for j in jobs) == work.cells_changed


def test_preview_dirties_the_cells_detection_and_propagation_dirty(
    world: World, tmp_path: Path
) -> None:
    """The preview finds a change's cells as change detection and chain propagation do
    (`model.dirty`): none where retention removed the raw rows, none before a rollup's first
    bucket, and the cells above every corrected cell, even where no value changes."""
    build(world, LEVELS)
    raw = world.catalog.raw["energy_raw"]
    # Retention removed the late hour's first quarter: the rollups' rows are its only record.
    gone = Window(LATE_HOUR.start, LATE_HOUR.start + timedelta(minutes=15))
    world.engine.raw.delete_rows(raw, gone, None, ChangeSource.MANUAL, retention=True)
    stored = {name: values(world, name) for name in LEVELS}
    first = first_bucket_start(world.catalog.rollup(HOURLY))
    noon = readings(NOON.start, NOON.start + timedelta(minutes=30), meters=("m1",))
    # Two readings of one hour trade values: no aggregate of the hour moves.
    swapped = noon.take([1, 0]).set_column(1, "ts", noon["ts"])
    batch = pa.concat_tables(
        [
            readings(gone.start, gone.end, 5.0, meters=("m1",)),
            readings(first - timedelta(hours=2), first - timedelta(hours=1), meters=("m1",)),
            swapped,
        ]
    )
    path = tmp_path / "edges.parquet"
    pq.write_table(batch.cast(SCHEMA), path)

    p = preview_ingest(world.engine, "energy_raw", path)
    assert (p.rows, p.inserted, p.updated) == (7, 5, 2)
    by_level = {w.rollup: w for w in p.work}
    hourly, daily = by_level[HOURLY], by_level[DAILY]
    assert (hourly.cells, hourly.buckets, hourly.cells_changed, hourly.rows_to_read) == (1, 1, 0, 4)
    # The hourly correction writes its difference rows all the same, and queues the day's.
    assert (daily.level, daily.cells, daily.cells_changed, daily.rows_to_read) == (2, 1, 0, 4)
    assert p.cells == []

    ingested = datetime.now(UTC)
    ingest_file(world.engine, "energy_raw", path, ChangeSource.MANUAL)
    world.tick(NOW)
    for name in LEVELS:
        jobs = [
            j
            for j in world.engine.ledger.history(name)
            if j.created_at >= ingested
            and j.trigger in (Trigger.PERIODIC, Trigger.CHAIN)
            and j.technique
        ]
        assert {j.technique for j in jobs} == {by_level[name].technique}, name
        assert sum(j.change_rows or 0 for j in jobs) == by_level[name].rows_to_read, name
        after = values(world, name)
        assert after.keys() == stored[name].keys(), name
        for key, was in stored[name].items():
            assert all(same(after[key][c], v) for c, v in was.items()), (name, key)
