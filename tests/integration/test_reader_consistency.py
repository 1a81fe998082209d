"""Reader consistency under load (DESIGN §3.2; issue 6 item 1).

A reader process (`reader_loop.py`, Spark-free `query_arrow`) queries the hourly and daily rollups
in a loop while this process runs many recomputes of overlapping windows: each cycle ingests a
correction that flips a set of readings between two known value sets A and B, then recomputes
through the sensor (entity-scoped jobs), manual requests over overlapping ranges (global
pointers), and periodic maintenance (full sweep + compaction). Every read must show each window
entirely at A or at B, with every entity present.

Determinism: the store's commit, flip and sweep are wrapped so that after each step this process
waits until the reader has completed `READS_PER_STEP` iterations that *started* after the step.
So every intermediate state (files written, rows committed but unreferenced, pointers flipped but
old rows not swept, swept) is read, whatever the scheduling, and those reads are also checked
against exactly the state the step must show (old before the flip, new after it).
"""

import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from itertools import pairwise
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import rollup_assets.orchestration.assets as factory
import rollup_assets.services.chain as chain
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.windows import Window
from rollup_assets.resources.rollup_store import RollupStore
from rollup_assets.services.maintenance import maintain
from tests.conftest import World, days
from tests.oracle import oracle, raw_frame

REPO = Path(__file__).resolve().parents[2]
NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 9)
METERS = 3
ROLLUPS = ("energy_hourly", "energy_daily")
# Two corrected areas: meters 0 and 1 over four morning hours of 2025-06-10, and meter 2 over
# 21:00-23:00Z, which straddles the Vienna midnight, so two local days change.
CHANGED = [
    ({"meter-0000", "meter-0001"}, datetime(2025, 6, 10, 8, tzinfo=UTC), timedelta(hours=4)),
    ({"meter-0002"}, datetime(2025, 6, 10, 21, tzinfo=UTC), timedelta(hours=2)),
]
QUERY = {
    "energy_hourly": (datetime(2025, 6, 10, 4, tzinfo=UTC), datetime(2025, 6, 11, 4, tzinfo=UTC)),
    "energy_daily": (datetime(2025, 6, 8, 22, tzinfo=UTC), datetime(2025, 6, 11, 22, tzinfo=UTC)),
}
READS_PER_STEP = 2
WAIT_TIMEOUT_S = 120


# -- data ---------------------------------------------------------------------------------------


def baseline() -> pa.Table:
    return pa.concat_tables(
        [
            day_batch(d, METERS, seed=21, missing=0.0, null_power=0.0, null_voltage=0.0)
            for d in days(FIRST, 3)
        ]
    )


def correction_sets(base: pa.Table) -> tuple[pa.Table, pa.Table]:
    """(A, B): the original readings of the corrected areas, and the same keys with new values.

    No optional value is null, so re-ingesting A restores the baseline exactly (the upsert keeps
    an existing optional value when the incoming one is null)."""
    ts = base["ts"]
    mask = None
    for entities, start, length in CHANGED:
        m = pc.and_(
            pc.is_in(base["entity_id"], value_set=pa.array(sorted(entities))),
            pc.and_(
                pc.greater_equal(ts, pa.scalar(start, ts.type)),
                pc.less(ts, pa.scalar(start + length, ts.type)),
            ),
        )
        mask = m if mask is None else pc.or_(mask, m)
    a = base.filter(mask)
    b = a.set_column(2, "energy_kwh", pc.add(pc.multiply(a["energy_kwh"], 2.0), 1.0))
    b = b.set_column(3, "power_kw", pc.add(b["power_kw"], 1.0))
    b = b.set_column(4, "voltage_v", pc.add(b["voltage_v"], 5.0))
    return a, b


def _plain(v: object) -> object:
    if v is None or (isinstance(v, float) and v != v):
        return None
    return v.item() if hasattr(v, "item") else v


def expected_windows(world: World, raw_a: pd.DataFrame, raw_b: pd.DataFrame) -> dict:
    """expect.json for the reader: per rollup, the query range and each window's A and B rows."""
    out = {}
    for name in ROLLUPS:
        spec = world.catalog.rollup(name)
        lo, hi = QUERY[name]
        windows: dict[str, dict] = {}
        for label, raw in (("A", raw_a), ("B", raw_b)):
            frame = oracle(raw, spec)
            frame = frame[(frame["bucket_start"] >= lo) & (frame["bucket_start"] < hi)]
            for row in frame.to_dict("records"):
                w = windows.setdefault(row["bucket_start"].isoformat(), {"A": {}, "B": {}})
                w[label][row["entity_id"]] = [_plain(row[c]) for c in spec.output_names]
        out[name] = {
            "start": lo.isoformat(),
            "end": hi.isoformat(),
            "columns": list(spec.output_names),
            "windows": windows,
        }
    return out


# -- the reader process -------------------------------------------------------------------------


class Reader:
    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.reader_loop", str(directory)],
            cwd=REPO,
            env=os.environ.copy(),
            stdout=subprocess.DEVNULL,
            stderr=open(directory / "reader.log", "wb"),  # noqa: SIM115 - lives as long as the process
        )

    def done(self) -> int:
        try:
            return int((self.dir / "progress").read_text())
        except (FileNotFoundError, ValueError):
            return -1

    def wait_for(self, iterations: int) -> None:
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while self.done() < iterations:
            if self.proc.poll() is not None:
                log = (self.dir / "reader.log").read_text()[-2000:]
                raise AssertionError(f"reader exited ({self.proc.returncode}): {log}")
            if time.monotonic() > deadline:
                raise AssertionError(f"reader stuck at {self.done()} < {iterations} iterations")
            time.sleep(0.005)

    def fresh_reads(self, n: int) -> int:
        """Block until `n` iterations that started after this call have completed; return the
        count seen at the call (iterations count+2 .. count+1+n are the fresh ones)."""
        seen = self.done()
        self.wait_for(seen + 1 + n)
        return seen

    def stop(self) -> dict:
        (self.dir / "stop").touch()
        try:
            self.proc.wait(timeout=WAIT_TIMEOUT_S)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
        return json.loads((self.dir / "result.json").read_text())

    def reads(self) -> list[dict]:
        with open(self.dir / "reads.jsonl") as f:
            return [json.loads(line) for line in f if line.strip()]


# -- the writer: a model of what every step must show ----------------------------------------------


class Model:
    """Which value set (A/B) each changed window of each rollup must show right now."""

    def __init__(self, expect: dict) -> None:
        self.expect = expect
        self.order = {r: sorted(e["windows"]) for r, e in expect.items()}
        self.changed = {
            r: {w for w, s in e["windows"].items() if s["A"] != s["B"]} for r, e in expect.items()
        }
        self.entities = {
            r: {
                w: {
                    ent
                    for ent in e["windows"][w]["A"]
                    if e["windows"][w]["A"][ent] != e["windows"][w]["B"][ent]
                }
                for w in self.changed[r]
            }
            for r, e in expect.items()
        }
        self.raw = "A"
        self.state = {r: dict.fromkeys(self.changed[r], "A") for r in expect}

    def flipped(self, rollup: str, buckets: list[Window], entities: frozenset[str] | None) -> None:
        for b in buckets:
            w = b.start.isoformat()
            if w not in self.changed.get(rollup, set()):
                continue
            if entities is not None and not self.entities[rollup][w] <= entities:
                self.state[rollup][w] = "?"  # the window legitimately mixes: do not pin it
                continue
            if rollup == "energy_hourly":
                self.state[rollup][w] = self.raw
            else:
                inside = {
                    s
                    for h, s in self.state["energy_hourly"].items()
                    if b.start <= datetime.fromisoformat(h) < b.end
                }
                self.state[rollup][w] = inside.pop() if len(inside) == 1 else "?"

    def settled(self) -> bool:
        return all(s == self.raw for r in self.state for s in self.state[r].values())


def install_steps(
    monkeypatch: pytest.MonkeyPatch, reader: Reader, model: Model, steps: list[dict], runs: list
) -> None:
    """Wrap commit/flip/sweep: after each, record what readers must see and wait for fresh reads."""

    def step(name: str, rollup: str) -> None:
        if rollup not in model.state:
            return
        seen = reader.fresh_reads(READS_PER_STEP)
        steps.append(
            {"step": name, "rollup": rollup, "after": seen, "state": copy.deepcopy(model.state)}
        )

    orig_commit, orig_flip, orig_sweep = (
        RollupStore.commit_generation,
        RollupStore.flip,
        RollupStore.sweep,
    )

    def commit_generation(self, spec, written, metadata, identity):
        step("written", spec.name)
        version = orig_commit(self, spec, written, metadata, identity)
        step("committed", spec.name)
        return version

    def flip(self, spec, cells, generation, **kw):
        version = orig_flip(self, spec, cells, generation, **kw)
        for entities, buckets in cells.groups():
            model.flipped(spec.name, buckets, entities)
        step("flipped", spec.name)
        return version

    def sweep(self, spec, buckets, entities, **kwargs):
        n = orig_sweep(self, spec, buckets, entities, **kwargs)
        step("swept", spec.name)
        return n

    orig_run: Callable = factory.run_recompute

    def run_recompute(*args, **kwargs):
        t0 = time.time()
        try:
            return orig_run(*args, **kwargs)
        finally:
            runs.append((t0, time.time()))

    monkeypatch.setattr(RollupStore, "commit_generation", commit_generation)
    monkeypatch.setattr(RollupStore, "flip", flip)
    monkeypatch.setattr(RollupStore, "sweep", sweep)
    monkeypatch.setattr(factory, "run_recompute", run_recompute)
    monkeypatch.setattr(chain, "run_recompute", run_recompute)  # levels a run carries on with


# -- the scenario -------------------------------------------------------------------------------


def run_scenario(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cycles: int
) -> dict:
    world.ops.activate("energy_raw", now=NOW)
    base = baseline()
    world.ingest(base, source="Import")
    for name in ROLLUPS:
        world.ops.activate(name, now=NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=3))])

    batch_a, batch_b = correction_sets(base)
    raw_a = world.raw()
    raw_b = raw_frame(
        pa.concat_tables([base.filter(pc.invert(_keys_in(base, batch_b))), batch_b]),
        world.catalog.raw["energy_raw"],
    )
    expect = expected_windows(world, raw_a, raw_b)
    model = Model(expect)
    assert model.changed["energy_hourly"] and len(model.changed["energy_daily"]) == 2

    rdir = tmp_path / "reader"
    rdir.mkdir()
    (rdir / "expect.json").write_text(json.dumps(expect))
    reader = Reader(rdir)
    steps: list[dict] = []
    runs: list[tuple[float, float]] = []
    try:
        reader.wait_for(1)
        install_steps(monkeypatch, reader, model, steps, runs)
        hourly_range = [
            (datetime(2025, 6, 10, 6, tzinfo=UTC), datetime(2025, 6, 11, 0, tzinfo=UTC)),
            (datetime(2025, 6, 10, 7, tzinfo=UTC), datetime(2025, 6, 10, 23, tzinfo=UTC)),
        ]
        for cycle in range(cycles):
            model.raw = "B" if cycle % 2 == 0 else "A"
            world.ingest(batch_b if model.raw == "B" else batch_a, source="Manual")
            kind = cycle % 3
            if kind >= 1:  # overlapping manual ranges (all entities) on top of the sensor's job
                a, b = hourly_range[cycle % 2]
                world.ops.request_recompute("energy_hourly", a, b)
            if kind == 2:
                world.ops.request_recompute("energy_daily", *QUERY["energy_daily"])
            world.tick(sensors=("retroactive_write_sensor",))
            assert model.settled(), (cycle, model.state)
            if cycle % 3 == 2:  # full sweep + compaction while the reader reads
                maintain(world.engine, now=NOW)
                steps.append(
                    {
                        "step": "maintained",
                        "rollup": "*",
                        "after": reader.fresh_reads(READS_PER_STEP),
                        "state": copy.deepcopy(model.state),
                    }
                )
        reader.fresh_reads(READS_PER_STEP)
    finally:
        result = reader.stop()
    return check_reads(reader.reads(), result, steps, runs, model)


def _keys_in(table: pa.Table, keys: pa.Table) -> pa.ChunkedArray:
    k = pc.binary_join_element_wise(table["entity_id"], pc.cast(table["ts"], pa.string()), "|")
    v = pc.binary_join_element_wise(keys["entity_id"], pc.cast(keys["ts"], pa.string()), "|")
    return pc.is_in(k, value_set=v.combine_chunks())


def check_reads(
    reads: list[dict], result: dict, steps: list[dict], runs: list, model: Model
) -> dict:
    by_key = {(r["i"], r["r"]): r["c"] for r in reads}
    step_mismatches = []
    pinned = 0
    for s in steps:
        for i in range(s["after"] + 2, s["after"] + 2 + READS_PER_STEP):
            for rollup, states in s["state"].items():
                codes = by_key[(i, rollup)]
                for w, want in states.items():
                    if want == "?":
                        continue
                    got = codes[model.order[rollup].index(w)]
                    pinned += 1
                    if got != want:
                        step_mismatches.append((s["step"], s["rollup"], rollup, w, want, got))
    under_load = sum(1 for r in reads if any(r["t0"] < b and a < r["t1"] for a, b in runs))
    transitions = 0
    for rollup in model.order:
        seq = [r["c"] for r in reads if r["r"] == rollup]
        transitions += sum(1 for x, y in pairwise(seq) if x != y)
    figures = {
        "reads": result["reads"],
        "reads_under_load": under_load,
        "recompute_runs": len(runs),
        # Runs that changed cells write, commit, flip and sweep; a run that found every cell
        # unchanged writes nothing.
        "flips": sum(1 for s in steps if s["step"] == "flipped"),
        "steps_checked": len(steps),
        "window_states_pinned": pinned,
        "state_changes_seen": transitions,
        "violations": result["violating_reads"],
        "step_mismatches": len(step_mismatches),
    }
    print(f"\nreader consistency: {json.dumps(figures)}")
    assert result["violating_reads"] == 0, result["violations"][:5]
    assert result["errors"] == []
    assert step_mismatches == [], step_mismatches[:10]
    return figures


def test_readers_see_each_window_whole_at_old_or_new_values(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = run_scenario(world, tmp_path, monkeypatch, cycles=4)
    assert figures["recompute_runs"] >= 8 and figures["flips"] >= 6
    # The first level's flips came from cells corrected by the change feed (differences).
    hourly = world.engine.ledger.history("energy_hourly", limit=500)
    assert any(j.technique == "difference" and j.cells_changed for j in hourly)
    assert figures["steps_checked"] >= 4 * figures["flips"]
    assert figures["reads_under_load"] >= READS_PER_STEP * figures["steps_checked"]
    assert figures["state_changes_seen"] >= 4


@pytest.mark.soak
def test_soak_readers_see_each_window_whole_at_old_or_new_values(
    world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    figures = run_scenario(world, tmp_path, monkeypatch, cycles=30)
    assert figures["reads_under_load"] >= READS_PER_STEP * figures["steps_checked"]
