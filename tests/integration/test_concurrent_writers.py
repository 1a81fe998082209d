"""Concurrent writers (DESIGN §3.4; issue 6 item 4): ingests land while recomputes run.

An ingesting process (`ingest_loop.py`) upserts waves of retroactive corrections into the raw
table while this process ticks the sensors and runs the recomputes of every level. Each wave is
two batches ingested at once by two threads into the same UTC-day partition, so the two MERGE
commits race each other. The waves are cued from the named fault points of the recompute and the
sensor (`after_write`, `after_commit`, `after_flip`, `during_sweep`, `sensor_planned`), so
each lands exactly there whatever the scheduling: after a run read its source but before it
flipped, between the sensor's detection and its cursor commit, and so on.

Checks: no ingest failed (a commit conflict is retried with a fresh snapshot, never surfaced);
every committed raw version was detected as a retroactive change of the hourly rollup; after
ticking to quiet every level equals the pandas oracle; a further tick launches nothing. While the
waves land only the retroactive sensor ticks (the recompute lane is what is under test); the
forward lane refreshes the open buckets once at the end.
"""

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rollup_assets.sensors.definitions as sensor_defs
from rollup_assets import faults
from rollup_assets.demo.sample_data import SCHEMA, day_batch, meter_ids
from rollup_assets.model.jobs import Trigger
from rollup_assets.model.windows import Window
from tests.conftest import World, days
from tests.oracle import compare_all

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 5, 29)  # Thursday: the data spans a month end and an ISO week boundary
DAYS = 5
METERS = 3
WAIT_TIMEOUT_S = 120
# Where each wave lands: (fault point, rollup whose run reaches it; None for the sensor).
SCHEDULE = [
    ("sensor_planned", None),
    ("after_write", "energy_hourly"),
    ("after_commit", "energy_daily"),
    ("after_flip", "energy_weekly"),
    ("during_sweep", "energy_monthly"),
]
RUN_POINTS = ("after_write", "after_commit", "after_flip", "during_sweep")


def wave_batches(rng: np.random.Generator, wave: int, threads: int = 2) -> list[pa.Table]:
    """`threads` corrections of distinct meters on one UTC day: changed values, late rows (new
    timestamps between readings) and null optional values (which keep the stored ones)."""
    day = FIRST + timedelta(days=(2 * wave) % DAYS)  # May and June days alternate
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    out = []
    for t in range(threads):
        meter = meter_ids(METERS)[(wave + t) % METERS]
        first = int(rng.integers(0, 90))
        slots = range(first, first + int(rng.integers(1, 7)))
        late = bool(rng.random() < 0.4)
        nulls = bool(rng.random() < 0.3)
        rows = [
            {
                "entity_id": meter,
                "ts": start + timedelta(minutes=15 * s + (7 if late else 0)),
                "energy_kwh": round(float(rng.uniform(0.0, 9.0)), 3),
                "power_kw": None if nulls else round(float(rng.uniform(0.0, 30.0)), 3),
                "voltage_v": None if nulls else round(float(rng.uniform(220.0, 240.0)), 2),
            }
            for s in slots
        ]
        out.append(pa.Table.from_pylist(rows, schema=SCHEMA))
    return out


class Ingester:
    """The ingesting process, and the cue: run wave k now and wait until it has committed."""

    def __init__(self, directory: Path, rng: np.random.Generator) -> None:
        self.dir = directory
        self.rng = rng
        self.waves: list[dict] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.ingest_loop", str(directory)],
            cwd=REPO,
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=open(directory / "ingest.log", "wb"),  # noqa: SIM115 - lives as long as the process
        )
        self._await(directory / "ready")

    def _await(self, path: Path) -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while not path.exists():
            if self.proc.poll() is not None:
                log = (self.dir / "ingest.log").read_text()[-2000:]
                raise AssertionError(f"ingester exited ({self.proc.returncode}): {log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"ingester did not produce {path.name}")
            time.sleep(0.005)

    def run_wave(self, where: str) -> None:
        k = len(self.waves)
        files = []
        for i, batch in enumerate(wave_batches(self.rng, k)):
            path = self.dir / f"wave-{k}-{i}.parquet"
            pq.write_table(batch, path)
            files.append(str(path))
        tmp = self.dir / f"go-{k}.tmp"
        tmp.write_text(json.dumps(files))
        os.replace(tmp, self.dir / f"go-{k}")
        self._await(self.dir / f"done-{k}")
        result = json.loads((self.dir / f"done-{k}").read_text())
        self.waves.append({"where": where, **result})

    def stop(self) -> None:
        (self.dir / "stop").touch()
        try:
            self.proc.wait(timeout=WAIT_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


@dataclass
class Cues:
    """Fires the next wave when the run (or the sensor) reaches the next scheduled point."""

    ingester: Ingester
    schedule: list[tuple[str, str | None]]
    fired: list[str] = field(default_factory=list)
    next: int = 0  # index into `schedule`

    def reached(self, point: str, rollup: str | None) -> None:
        if self.pending and self.schedule[self.next] == (point, rollup):
            self.next += 1
            self.fire(f"{point}:{rollup or 'sensor'}")

    def fire(self, where: str) -> None:
        self.fired.append(where)
        self.ingester.run_wave(where)

    @property
    def pending(self) -> bool:
        return self.next < len(self.schedule)


def install_cues(monkeypatch: pytest.MonkeyPatch, cues: Cues) -> None:
    original = sensor_defs.checkpoint

    def at_run_point(point: str, rollup: str | None) -> None:
        if point != "sensor_planned":
            cues.reached(point, rollup)

    def at_sensor_point(point: str, archive: str | None = None) -> None:
        original(point, archive)
        # Only a tick that detected new commits has a cursor move to lose: cue the wave there.
        detection = sys._getframe(1).f_locals.get("detection")
        if detection is not None and detection.jobs:
            cues.reached(point, None)

    # For the whole test: every point a run reaches is heard (the list is restored after it).
    monkeypatch.setattr(faults, "_hooks", [at_run_point])
    monkeypatch.setattr(sensor_defs, "checkpoint", at_sensor_point)


def random_schedule(rng: np.random.Generator, n: int) -> list[tuple[str, str | None]]:
    levels = ["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly"]
    out: list[tuple[str, str | None]] = []
    for _ in range(n):
        if rng.random() < 0.2:
            out.append(("sensor_planned", None))
        else:
            out.append((str(rng.choice(RUN_POINTS)), str(rng.choice(levels))))
    return out


def run_scenario(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, schedule, seed: int
) -> dict:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(
        pa.concat_tables([day_batch(d, METERS, seed=seed) for d in days(FIRST, DAYS)]),
        source="Import",
    )
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)
    assert compare_all(world.query, world.raw(), world.catalog) == []

    wdir = tmp_path / "ingest"
    wdir.mkdir()
    ingester = Ingester(wdir, np.random.default_rng(seed))
    cues = Cues(ingester, list(schedule))
    install_cues(monkeypatch, cues)
    ticks = 0
    t0 = time.monotonic()
    try:
        while cues.pending:
            fired = len(cues.fired)
            reports = world.tick(NOW, sensors=("retroactive_write_sensor",))
            ticks += len(reports)
            if cues.pending and len(cues.fired) == fired and not any(r.runs for r in reports):
                # Nothing ran or detected that could reach the next point: land an extra wave
                # between ticks (this is how the first wave lands).
                cues.fire("idle")
            assert ticks < 40 * len(schedule), "the waves never drained"
        ticks += len(world.tick(NOW))  # the forward lane refreshes the open buckets once
    finally:
        ingester.stop()
    elapsed = time.monotonic() - t0

    errors = [e for w in ingester.waves for e in w["errors"]]
    assert errors == [], errors  # a conflict between writers must be retried, not surfaced
    versions = sorted(v for w in ingester.waves for v in w["versions"])
    assert len(versions) == 2 * len(ingester.waves)
    detected = {
        j.source_version
        for j in world.engine.ledger.snapshot().for_rollup("energy_hourly")
        if j.trigger is Trigger.PERIODIC and j.source_archive == "energy_raw"
    }
    lost = [v for v in versions if v not in detected]
    assert lost == [], f"raw versions never detected as dirty: {lost}"
    problems = compare_all(world.query, world.raw(), world.catalog)
    assert problems == [], problems
    again = world.tick(NOW)
    assert sum(len(r.runs) for r in again) == 0
    figures = {
        "waves": len(ingester.waves),
        "concurrent_ingests": len(versions),
        "landed_at": [w["where"] for w in ingester.waves],
        "ticks": ticks,
        "ingest_errors": len(errors),
        "lost_versions": len(lost),
        "seconds": round(elapsed, 1),
    }
    print(f"\nconcurrent writers: {json.dumps(figures)}")
    return figures


def test_ingests_during_recomputes_lose_nothing_and_surface_no_conflict(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = run_scenario(world, tmp_path, monkeypatch, SCHEDULE, seed=31)
    landed = [w for w in figures["landed_at"] if w != "idle"]
    assert landed == [f"{p}:{r or 'sensor'}" for p, r in SCHEDULE], (
        "a wave did not land at its scheduled point"
    )


@pytest.mark.soak
def test_soak_ingests_during_recomputes(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = np.random.default_rng(2024)
    run_scenario(world, tmp_path, monkeypatch, random_schedule(rng, 30), seed=32)
