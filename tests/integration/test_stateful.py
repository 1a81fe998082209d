"""A stateful model test: random sequences of operations against the real system, checked after
every step against a plain pandas model of the raw data.

Operations: ingest new, late, corrected and identical readings; delete readings (a correction);
tick the sensors until quiet; materialize a range; a manual recompute with and without entity
scope; freeze and unfreeze; rewind; rollback; disable and enable; delete everything and
re-create it; maintenance (which folds buckets with two cell pointers or more here); a week
passing, after which maintenance folds every difference (the rollback window is over); more
corrections of one meter's extremes than a cell keeps spares of; raw retention; a new formula
for the computed column. And the faults and races between them:

  * an operator action (rewind, rollback, freeze, maintenance, retention, disable, a column
    change, an ingest, delete and re-create) run *between* two steps of a running recompute, at
    one of its fault points (one rule per action; `make soak` also runs every action at every
    point once); and an operator's recompute of the weeks or months (which read the days) run
    between two steps of a correction of the days;
  * a recompute run started between a rollback's checks and its pointer commit;
  * a transient failure at any point of a recompute or a forward run (the work is retried);
  * a kill at any point of a recompute (recovered by the next tick) and at every intent and
    effect point of an operator action (finished by the same command again, or by the sensor
    once the intent is stale).

Invariants after every step:
  * a reader never sees a cell (window, entity) twice, nor a row of a generation that is not
    the cell's active one;
  * once the sensors are quiet and nothing is frozen or disabled, every level equals a pandas
    aggregation of the model (every acknowledged write reflected exactly once; buckets whose raw
    rows retention removed keep what they held and are left out), no job or action is still
    open, and no pointer names a generation without rows for a cell the model gives a value;
  * the job history agrees with what ran: every active pointer was flipped by a completed job
    (or restored by a rollback), and every job that recorded a run id names a run Dagster knows.

The clock is pinned (`NOW`), the data spans the Vienna DST end of 2025, an ISO week boundary and
a month end. Every sequence starts from a copy of one backfilled warehouse and ends settled
(freezes lifted, rollups enabled, sensors quiet), checked once more. `make test` runs a small
fixed budget with a fixed seed (the same sequences every time); `make soak` a large one
(ROLLUPS_SOAK_SEQUENCES, ROLLUPS_SOAK_STEPS, ROLLUPS_SOAK_SEED). Every run writes its figures
(sequences, steps, each operation, interleaving and kill point) to test-artifacts/.
"""

import functools
import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import rollup_assets.services.recompute as recompute
from rollup_assets import faults
from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import SCHEMA
from rollup_assets.model.column_rules import ColumnAction
from rollup_assets.model.errors import IngestValidationError, RollbackRefusedError, RollupsError
from rollup_assets.model.intents import STALE_AFTER
from rollup_assets.model.jobs import ChangeSource, JobState, RetryPolicy, Trigger
from rollup_assets.model.keeping import Keeping
from rollup_assets.model.partials import SPARES
from rollup_assets.model.placement import cells_of
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Catalog
from rollup_assets.model.states import ArchiveStatus
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.dagster_internals import fail_dead_run
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import tick_until_quiet
from rollup_assets.resources.genmap import read_pointers
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.columns import change_column
from rollup_assets.services.engine import Engine
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.operations import Operations
from rollup_assets.services.recovery import recover
from rollup_assets.services.retention import apply_retention
from rollup_assets.settings import DEFAULT_SPECS, Settings
from tests.conftest import REPO_ARTIFACTS, World, instance_in
from tests.exactly_once import dangling_pointers
from tests.oracle import compare_all

NOW = datetime(2025, 11, 3, 12, 0, tzinfo=UTC)
START = datetime(2025, 10, 24, tzinfo=UTC)  # ten days: DST end, a new ISO week, a month end
DAYS = 10
METERS = ("m0", "m1", "m2")
HOURLY = "energy_hourly"
ROLLUPS = (HOURLY, "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly")
# Where a recompute can be stopped, failed or met by another action.
JOB_POINTS = ("before_correct", "after_write", "after_commit", "before_flip", "after_flip")
KILL_POINTS = (*JOB_POINTS, "during_sweep")
FORWARD_POINTS = ("after_claim", "after_forward")
ACTIONS = (
    "rewind", "rollback", "freeze", "maintain", "retention", "disable", "column", "ingest",
    "recreate",
)  # fmt: skip
ACTION_KILLS = (
    "rewind_intent",
    "rewind_pointers",
    "rewind_rows",
    "rollback_intent",
    "rollback_commit",
    "column_intent",
    "column_switch",
    "retention_state",
    "merge_attempt",
)
D = timedelta(days=1)
# The levels reading the days, and the partition keys of their buckets holding the ten days.
ABOVE = {
    "energy_weekly": ("2025-10-20", "2025-10-27"),
    "energy_monthly": ("2025-10-01", "2025-10-01"),
}
VALUES = st.floats(0.0, 50.0, allow_nan=False).map(lambda v: round(v, 3))
FIGURES: Counter = Counter()
# Flips at or before the last instant here are past the rollback window, as a week later: the
# `week_passes` rule appends to it; every sequence starts with it empty.
WINDOW_PASSED: list[datetime] = []


def timed(fn):
    """Count a rule's calls and seconds in FIGURES (rule name -> calls, `<name>_s` -> seconds)."""

    @functools.wraps(fn)
    def wrapper(self, *args, **kwargs):
        t0 = time.monotonic()
        try:
            return fn(self, *args, **kwargs)
        finally:
            FIGURES[f"{fn.__name__}_s"] += round(time.monotonic() - t0, 1)

    return wrapper


class Killed(BaseException):
    """The process dies at a fault point (it bypasses every `except Exception`)."""


def readings(rows: list[tuple[str, datetime, float]]) -> pa.Table:
    """Readings whose power and voltage follow from the energy value (so Avg, Min and Max of a
    corrected reading change with it)."""
    return pa.Table.from_pylist(
        [
            {"entity_id": e, "ts": t, "energy_kwh": v, "power_kw": 4 * v, "voltage_v": 220 + v}
            for e, t, v in rows
        ],
        schema=SCHEMA,
    )


def base_rows() -> list[tuple[str, datetime, float]]:
    """One reading per meter every three hours of the ten days."""
    return [
        (m, START + timedelta(hours=3 * i), round(1.0 + 0.1 * i + j, 3))
        for i in range(DAYS * 8)
        for j, m in enumerate(METERS)
    ]


def frame(rows: list[tuple[str, datetime, float]]) -> pd.DataFrame:
    new = pd.DataFrame(rows, columns=["entity_id", "ts", "energy_kwh"])
    new["ts"] = pd.to_datetime(new["ts"], utc=True)
    return new


def with_factor(factor: float) -> Catalog:
    """The shipped catalog, its computed current multiplied by `factor`."""
    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    formula = "power_kw * 1000 / voltage_v" + ("" if factor == 1 else f" * {factor:g}")
    doc["raw_archives"]["energy_raw"]["columns"]["current_a"]["formula"] = formula
    return parse_catalog(doc, origin=f"current x {factor:g}")


@contextmanager
def opened(root: Path) -> Iterator[World]:
    """A world over `root`'s warehouse and Dagster home (what `fresh_world` builds; a copy of
    the template's, or the template being built). Failed work is retried at once."""
    wh, home = root / "warehouse", root / "dagster_home"
    home.mkdir(parents=True, exist_ok=True)
    saved = {k: os.environ.get(k) for k in ("ROLLUPS_WAREHOUSE", "DAGSTER_HOME")}
    os.environ.update(ROLLUPS_WAREHOUSE=str(wh), DAGSTER_HOME=str(home))
    try:
        catalog = load_catalog()
        resource = WarehouseResource(root=str(wh), retry_backoff_seconds=0)
        defs = build_definitions(catalog, resource, settings=Settings.from_env())
        engine = Engine(catalog, Warehouse(str(wh)), retry=RetryPolicy(backoff=timedelta(0)))
        with instance_in(home, catalog) as instance:
            yield World(root, catalog, engine, defs, instance)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def create(world: World) -> None:
    """Activate everything, ingest ten days, backfill them, let the sensors settle."""
    activate(world)
    fill(world)


def activate(world: World) -> None:
    """Activate everything and ingest ten days (no run: nothing here waits for a rollup's slot)."""
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(readings(base_rows()), source="Manual")
    world.activate_all(NOW)


def fill(world: World) -> None:
    """Backfill the ten days and let the sensors settle (runs that hold each rollup's slot)."""
    world.backfill([Window(START, START + timedelta(days=DAYS))])
    world.tick(NOW)


def during_a_job(action: str, ready=lambda self: True):
    """The rule: `action` run between two steps of a running recompute, at a drawn point. One
    rule per action, so that every action is drawn as often as any other rule and every
    (action, point) pair is reached within a soak's budget."""

    def rule_(self, point: str, hours_back: int, days: int, slot: int, value: float) -> None:
        self.action_during_a_job(point, action, hours_back, days, slot, value)

    rule_.__name__ = rule_.__qualname__ = f"{action}_during_a_job"
    draws = rule(
        point=st.sampled_from(JOB_POINTS),
        hours_back=st.integers(1, 48),
        days=st.integers(1, 2),
        slot=st.integers(0, DAYS * 96 - 1),
        value=VALUES,
    )

    def runs(self) -> bool:
        return HOURLY not in self.disabled and not self.frozen and ready(self)

    return precondition(runs)(draws(timed(rule_)))


class Rollups(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        FIGURES["sequences"] += 1
        root = Path(ROOT) / f"sequence-{FIGURES['sequences']}"
        root.mkdir(parents=True)
        for part in ("warehouse", "dagster_home"):
            shutil.copytree(Path(TEMPLATE) / part, root / part)
        self._world = opened(root)
        self.world = self._world.__enter__()
        WINDOW_PASSED.clear()
        self.model = frame(base_rows())
        self.frozen: set[str] = set()
        self.disabled: set[str] = set()
        self.settled = True
        self.recreated = False
        self.factor = 1.0
        # Each formula's engine (a change of the computed column applies its spec's formula).
        self.engines = {1.0: self.world.engine}

    def teardown(self) -> None:
        """Every sequence ends settled: freezes lifted, rollups enabled, the sensors quiet, and
        the levels checked once more against the model."""
        try:
            if self.frozen:
                self.unfreeze()
            if self.disabled:
                self.enable()
            self.tick_until_quiet()
            self.quiet_means_equal_to_the_model_and_nothing_open()
        finally:
            self._world.__exit__(None, None, None)

    # -- the model -------------------------------------------------------------------------------

    @property
    def retained_from(self) -> datetime | None:
        return self.world.engine.states.get("energy_raw").retained_from

    def upsert(self, rows: list[tuple[str, datetime, float]], kind: str) -> None:
        """Ingest `rows`; the model takes them, or nothing when the ingest refuses them (readings
        before what retention keeps)."""
        kept = self.retained_from
        # One row per key, the last drawn winning (a batch with a key twice is refused).
        rows = list({(e, t): (e, t, v) for e, t, v in rows}.values())
        try:
            self.world.ingest(readings(rows), source="Manual")
        except IngestValidationError:
            assert kept is not None and min(t for _, t, _ in rows) < kept
            FIGURES[f"ingest_{kind}_refused"] += 1
            return
        self.take(rows)
        FIGURES[f"ingest_{kind}"] += 1

    def take(self, rows: list[tuple[str, datetime, float]]) -> None:
        merged = pd.concat([self.model, frame(rows)]).drop_duplicates(
            ["entity_id", "ts"], keep="last"
        )
        self.model = merged.reset_index(drop=True)
        self.settled = False

    def tick_until_quiet(self) -> None:
        self.world.tick(NOW)
        self.settled = not self.frozen and not self.disabled

    def quiet(self) -> None:
        """The sensors until quiet, letting runs fail (a race or a fault failed them: their work
        is queued again), then once more, where nothing may fail."""
        tick_until_quiet(self.world.defs, self.world.instance, NOW)
        self.tick_until_quiet()

    def engine_for(self, factor: float) -> Engine:
        if factor not in self.engines:
            w = self.world.engine
            self.engines[factor] = Engine(
                with_factor(factor), w.warehouse, retry=RetryPolicy(backoff=timedelta(0))
            )
        return self.engines[factor]

    def late_rows(self, points: list[tuple[int, float]], entity: str = "m1"):
        return [(entity, START + timedelta(minutes=15 * s + 11), v) for s, v in points]

    # -- rules: writes and reads -----------------------------------------------------------------

    @rule(points=st.lists(st.tuples(st.sampled_from(METERS), st.integers(0, DAYS * 96 - 1),
                                    VALUES),
                          min_size=1, max_size=4))  # fmt: skip
    @timed
    def ingest_late(self, points: list[tuple[str, int, float]]) -> None:
        """New readings between the existing ones, anywhere in the ten days."""
        self.upsert([(m, START + timedelta(minutes=15 * s + 7), v) for m, s, v in points], "late")

    @rule(points=st.lists(st.tuples(st.sampled_from(METERS), st.integers(0, 23),
                                    VALUES),
                          min_size=1, max_size=3))  # fmt: skip
    @timed
    def ingest_new(self, points: list[tuple[str, int, float]]) -> None:
        """Readings of the last hours before `NOW`: the forward lane's (open or just closed)."""
        self.upsert([(m, NOW - timedelta(minutes=15 * (s + 1)), v) for m, s, v in points], "new")

    @precondition(lambda self: len(self.model) > 0)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4),
          value=VALUES)  # fmt: skip
    @timed
    def ingest_corrected(self, picks: list[int], value: float) -> None:
        rows = self.model.iloc[sorted({p % len(self.model) for p in picks})]
        keys = zip(rows.entity_id, rows.ts, strict=True)
        self.upsert([(e, t.to_pydatetime(), value) for e, t in keys], "corrected")

    @precondition(lambda self: len(self.model) > 0)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=4))
    @timed
    def ingest_identical(self, picks: list[int]) -> None:
        rows = self.model.iloc[sorted({p % len(self.model) for p in picks})]
        self.upsert(
            [(e, t.to_pydatetime(), float(v)) for e, t, v in rows.itertuples(index=False)],
            "identical",
        )

    @precondition(lambda self: len(self.model) > 0)
    @rule(picks=st.lists(st.integers(0, 10**6), min_size=1, max_size=3))
    @timed
    def delete_readings(self, picks: list[int]) -> None:
        """Correcting deletes (each its own commit): every level drops what the rows gave."""
        rows = self.model.iloc[sorted({p % len(self.model) for p in picks})]
        raw = self.world.catalog.raw["energy_raw"]
        for e, t in zip(rows.entity_id, rows.ts, strict=True):
            at = t.to_pydatetime()
            span = Window(at, at + timedelta(microseconds=1))
            self.world.engine.raw.delete_rows(
                raw, span, frozenset({e}), ChangeSource.MANUAL, retention=False
            )
        self.model = self.model.drop(rows.index).reset_index(drop=True)
        self.settled = False
        FIGURES["delete_readings"] += 1

    @rule()
    @timed
    def tick(self) -> None:
        self.tick_until_quiet()
        FIGURES["tick"] += 1

    @precondition(lambda self: HOURLY not in self.disabled)
    @rule(day=st.integers(0, DAYS - 2))
    @timed
    def materialize(self, day: int) -> None:
        start = START + timedelta(days=day)
        run = self.world.materialize(HOURLY, f"{start:%Y-%m-%d}-00:00", f"{start:%Y-%m-%d}-05:00")
        # Partition keys are local times of the rollup's zone: the range starts at local midnight.
        zone = ZoneInfo(self.world.catalog.rollup(HOURLY).reference_time_zone)
        local = datetime.combine(start.date(), datetime.min.time(), zone).astimezone(UTC)
        gone = self.retained_from is not None and local < self.retained_from
        assert run.success != gone, run.error  # only work over removed raw rows is refused
        self.settled = False
        FIGURES["materialize"] += 1

    @rule(rollup=st.sampled_from(ROLLUPS[:3]), day=st.integers(0, DAYS - 2), scoped=st.booleans())
    @timed
    def manual_recompute(self, rollup: str, day: int, scoped: bool) -> None:
        if rollup in self.disabled:
            return
        start = START + timedelta(days=day)
        entities = frozenset({"m1"}) if scoped else None
        try:
            self.world.ops.request_recompute(rollup, start, start + D, entities)
        except RollupsError:  # over raw rows retention removed
            assert self.retained_from is not None and start < self.retained_from
            FIGURES["recompute_refused"] += 1
            return
        self.settled = False
        FIGURES["recompute_scoped" if scoped else "recompute"] += 1

    # -- rules: operator actions -----------------------------------------------------------------

    @precondition(lambda self: not self.frozen)
    @rule(rollup=st.sampled_from(ROLLUPS[:2]), day=st.integers(1, DAYS - 2))
    @timed
    def freeze(self, rollup: str, day: int) -> None:
        self.world.ops.freeze(rollup, START + timedelta(days=day))
        self.frozen.add(rollup)
        self.settled = False
        FIGURES["freeze"] += 1

    @precondition(lambda self: bool(self.frozen))
    @rule()
    @timed
    def unfreeze(self) -> None:
        for rollup in sorted(self.frozen):
            self.world.ops.unfreeze(rollup)
        self.frozen.clear()
        self.settled = False
        FIGURES["unfreeze"] += 1

    @precondition(lambda self: HOURLY not in self.disabled)
    @rule(hours_back=st.integers(1, 48))
    @timed
    def rewind(self, hours_back: int) -> None:
        self.rewound(hours_back)
        FIGURES["rewind"] += 1

    def rewound(self, hours_back: int) -> None:
        mark = self.world.engine.states.get(HOURLY).watermark
        assert mark is not None
        self.world.ops.rewind(HOURLY, mark - timedelta(hours=hours_back))
        self.settled = False

    @precondition(lambda self: HOURLY not in self.disabled and not self.frozen)
    @rule(race=st.booleans())
    @timed
    def rollback(self, race: bool) -> None:
        """Roll back the newest hourly correction (then recompute its cells, so the model holds
        again); with `race`, a late write's recompute runs between the rollback's checks and
        its pointer commit."""
        ran: list[bool] = []

        def run_a_recompute(point: str, archive: str | None) -> None:
            if race and point == "rollback_intent" and not ran:
                ran.append(True)
                self.upsert(self.late_rows([(10, 7.5), (500, 2.5)]), "late")
                tick_until_quiet(self.world.defs, self.world.instance, NOW)

        with faults.hooked(run_a_recompute):
            done = self.roll_back_newest()
        if done is not None:
            FIGURES[f"rollback{'_refused' if not done else ''}{'_race' if ran else ''}"] += 1

    def roll_back_newest(self) -> bool | None:
        """Roll back the newest hourly correction and recompute what it gave back: None when
        there is none, False when the rollback is refused (having changed nothing)."""
        job = self.newest_flip()
        if job is None:
            return None
        try:
            out = self.world.ops.rollback(HOURLY, job.job_id)
        except RollbackRefusedError:
            return False
        self.recompute_rolled_back(out.cells.windows, out.cells.entities)
        return True

    def newest_flip(self):
        snap = self.world.engine.ledger.snapshot()
        undone = {j.undoes for j in snap.for_rollup(HOURLY) if j.undoes}
        flips = [
            j
            for j in snap.for_rollup(HOURLY)
            if j.state is JobState.COMPLETED
            and j.windows_processed
            and j.generation
            and j.trigger is not Trigger.ROLLBACK
            and j.job_id not in undone
        ]
        return flips[-1] if flips else None

    def recompute_rolled_back(self, windows, entities) -> None:
        """The operator's follow-up of a rollback: recompute what it gave back (the levels above
        were queued by the rollback itself), so every level equals the model again."""
        for w in windows:
            if self.retained_from is not None and w.start < self.retained_from:
                continue
            self.world.ops.request_recompute(HOURLY, w.start, w.end, entities)
        self.settled = False

    @precondition(lambda self: not self.disabled)
    @rule(rollup=st.sampled_from(ROLLUPS))
    @timed
    def disable(self, rollup: str) -> None:
        self.world.ops.disable(rollup)
        self.disabled.add(rollup)
        self.settled = False
        FIGURES["disable"] += 1

    @precondition(lambda self: bool(self.disabled))
    @rule()
    @timed
    def enable(self) -> None:
        # With the spec of the formula the raw table applies now (a column change may have
        # switched it while the rollup was disabled: enabling checks it is applied).
        ops = Operations(self.engine_for(self.factor), actor="test")
        for rollup in [r for r in ROLLUPS if r in self.disabled]:  # each after its source
            ops.enable(rollup, now=NOW)
        self.disabled.clear()
        self.settled = False
        FIGURES["enable"] += 1

    # Once per sequence: a re-creation costs a whole backfill.
    @precondition(lambda self: not self.frozen and not self.disabled and not self.recreated)
    @rule()
    @timed
    def delete_and_recreate(self) -> None:
        self.recreate()
        FIGURES["delete_and_recreate"] += 1

    def recreate(self, fill_later: bool = False) -> None:
        """Delete everything and create it again; with `fill_later`, the backfill is left to
        the caller (a run of the rollup under way holds its slot: the backfill's runs wait)."""
        for name in [*reversed(ROLLUPS), "energy_raw"]:
            self.world.ops.disable(name)
            self.world.ops.delete(name)
        activate(self.world)
        if not fill_later:
            fill(self.world)
        self.model = frame(base_rows())
        self.factor = 1.0
        self.recreated = True
        self.settled = False

    @rule()
    @timed
    def run_maintenance(self) -> None:
        report = maintain(self.world.engine, now=NOW)
        assert report.failures == []
        FIGURES["maintain"] += 1
        FIGURES["buckets_queued_to_fold"] += report.buckets_to_fold

    @rule()
    @timed
    def week_passes(self) -> None:
        """Every flip so far leaves the rollback window: maintenance folds the differences of
        every closed bucket into new bases, and rollbacks of those flips are refused."""
        WINDOW_PASSED.append(datetime.now(UTC))
        report = maintain(self.world.engine, now=NOW)
        assert report.failures == []
        FIGURES["week_passes"] += 1
        FIGURES["buckets_queued_to_fold"] += report.buckets_to_fold
        self.settled = False

    @precondition(lambda self: len(self.model) > SPARES)
    @rule(meter=st.sampled_from(METERS), largest=st.booleans())
    @timed
    def exhaust_spares(self, meter: str, largest: bool) -> None:
        """Correct two more of one meter's largest (or smallest) readings than a cell keeps
        spare extremes of, to its median: the spares of the cells holding them run out, and
        those cells are aggregated again from their source."""
        rows = self.model[self.model.entity_id == meter]
        if len(rows) <= SPARES + 2:
            return
        pick = rows.nlargest if largest else rows.nsmallest
        chosen = pick(SPARES + 2, "energy_kwh")
        middle = round(float(rows.energy_kwh.median()), 3)
        keys = zip(chosen.entity_id, chosen.ts, strict=True)
        self.upsert([(e, t.to_pydatetime(), middle) for e, t in keys], "spares")

    @rule(days=st.integers(1, 3))
    @timed
    def retention(self, days: int) -> None:
        self.retain(days)
        FIGURES["retention"] += 1

    def retain(self, days: int) -> None:
        """Raw retention as of an instant that puts the first `days` UTC days past the horizon:
        they go once aggregated (pending work holds them back); the model loses their rows,
        the rollups keep what they aggregated."""
        retention = self.world.catalog.raw["energy_raw"].retention
        assert retention is not None
        apply_retention(self.world.engine, START + days * D + retention + timedelta(hours=1))
        self.drop_retained()

    def drop_retained(self) -> None:
        kept = self.retained_from
        if kept is not None:
            self.model = self.model[self.model["ts"] >= pd.Timestamp(kept)].reset_index(drop=True)

    @rule()
    @timed
    def column_change(self) -> None:
        """The computed current's formula switches between x1 and x2: every level over it is
        recomputed from the switch commit."""
        self.change_formula()
        FIGURES["column_change"] += 1

    def change_formula(self) -> None:
        target = 2.0 if self.factor == 1.0 else 1.0
        change_column(self.engine_for(target), "energy_raw", "current_a", ColumnAction.SET_FORMULA)
        self.factor = target
        self.settled = False

    # -- rules: races and faults -----------------------------------------------------------------

    def action_during_a_job(
        self, point: str, action: str, hours_back: int, days: int, slot: int, value: float
    ) -> None:
        """A late write's recompute meets an operator action between two of its steps."""
        self.upsert(self.late_rows([(slot, value), (700, value + 1)]), "late")
        fired: list[str] = []

        def act(reached: str, archive: str | None) -> None:
            if reached != point or archive != HOURLY or fired:
                return
            fired.append(action)
            if action == "rewind":
                self.rewound(hours_back)
            elif action == "rollback":
                self.roll_back_newest()
            elif action == "freeze":
                self.world.ops.freeze(HOURLY, START + days * D)
                self.frozen.add(HOURLY)
            elif action == "maintain":
                assert maintain(self.world.engine, now=NOW).failures == []
            elif action == "retention":
                self.retain(days)
            elif action == "disable":
                self.world.ops.disable(HOURLY)
                self.disabled.add(HOURLY)
            elif action == "column":
                self.change_formula()
            elif action == "recreate":
                self.recreate(fill_later=True)
            else:
                self.upsert(self.late_rows([(40, 1.5), (300, 4.0)], "m2"), "late")

        with faults.hooked(act):
            tick_until_quiet(self.world.defs, self.world.instance, NOW)
        if fired and action == "recreate":
            fill(self.world)
        self.settled = False
        FIGURES[f"interleave_{action}_at_{point}" if fired else "interleave_not_reached"] += 1

    rewind_during_a_job = during_a_job("rewind")
    rollback_during_a_job = during_a_job("rollback")
    freeze_during_a_job = during_a_job("freeze")
    maintain_during_a_job = during_a_job("maintain")
    retention_during_a_job = during_a_job("retention")
    disable_during_a_job = during_a_job("disable")
    column_during_a_job = during_a_job("column")
    ingest_during_a_job = during_a_job("ingest")
    # Once per sequence, and only with every level enabled (see `delete_and_recreate`).
    recreate_during_a_job = during_a_job(
        "recreate", lambda self: not self.disabled and not self.recreated
    )

    @precondition(lambda self: not self.disabled and not self.frozen)
    @rule(
        point=st.sampled_from(JOB_POINTS),
        level=st.sampled_from(sorted(ABOVE)),
        slot=st.integers(0, DAYS * 96 - 1),
        value=VALUES,
    )
    @timed
    def recompute_above_during_a_job(self, point: str, level: str, slot: int, value: float) -> None:
        """A late write's correction of the days meets, between two of its steps, an operator's
        recompute of a level that reads the days (a cell of the days whose kept extremes ran out
        must not be read ahead of the version the recompute records)."""
        self.upsert(self.late_rows([(slot, value)]), "late")
        fired: list[str] = []

        def act(reached: str, archive: str | None) -> None:
            if reached != point or archive != "energy_daily" or fired:
                return
            fired.append(level)
            # A run of its own, as an operator's: the run under way may hold the slots of the
            # levels below (it carries the chain), which a sensor tick here would wait for.
            first, last = ABOVE[level]
            self.world.materialize(level, first, last)

        with faults.hooked(act):
            tick_until_quiet(self.world.defs, self.world.instance, NOW)
        self.settled = False
        FIGURES[
            f"interleave_recompute_above_at_{point}" if fired else "interleave_not_reached"
        ] += 1

    @precondition(lambda self: HOURLY not in self.disabled)
    @rule(point=st.sampled_from((*JOB_POINTS, *FORWARD_POINTS)), value=VALUES)
    @timed
    def transient_failure(self, point: str, value: float) -> None:
        """A write whose run fails once at `point` (a storage error): the work is retried."""
        if point in FORWARD_POINTS:
            self.upsert([("m0", NOW - timedelta(minutes=20), value)], "new")
        else:
            self.upsert(self.late_rows([(90, value)]), "late")
        with faults_at(point):
            tick_until_quiet(self.world.defs, self.world.instance, NOW)
        self.settled = False
        FIGURES[f"fail_{point}"] += 1

    @precondition(lambda self: HOURLY not in self.disabled)
    @rule(point=st.sampled_from(KILL_POINTS), points=st.lists(
        st.tuples(st.integers(0, DAYS * 96 - 1), VALUES),
        min_size=1, max_size=3))  # fmt: skip
    @timed
    def kill_then_recover(self, point: str, points: list[tuple[int, float]]) -> None:
        """A late write whose recompute dies at `point`; the next tick recovers it."""
        self.upsert([("m2", START + timedelta(minutes=15 * s + 3), v) for s, v in points], "late")
        fired: list[str] = []

        def die_at(reached: str, archive: str | None) -> None:
            if reached == point and not fired:
                fired.append(reached)
                raise Killed(point)

        # The process dies at the point: no handler of its runs, none of the drain's, runs.
        # (`run_recompute` calls `services.job_failure.record_failure` by the name its module
        # imported, so that name is the one replaced.)
        original = recompute.record_failure
        recompute.record_failure = lambda *a, **k: None  # type: ignore[assignment]
        try:
            with faults.hooked(die_at):
                tick_until_quiet(self.world.defs, self.world.instance, NOW)
        except Killed:
            assert fired == [point]
        finally:
            recompute.record_failure = original  # type: ignore[assignment]
        # The process is gone: what the sensor's dead-run reaper does, done here.
        for record in self.world.instance.get_run_records(
            filters=dg.RunsFilter(statuses=[dg.DagsterRunStatus.STARTED])
        ):
            fail_dead_run(self.world.instance, record.dagster_run, "process killed")
        FIGURES[f"kill_{point}" if fired else "kill_not_reached"] += 1
        self.tick_until_quiet()

    @precondition(lambda self: HOURLY not in self.disabled and not self.frozen)
    @rule(point=st.sampled_from(ACTION_KILLS), by_sensor=st.booleans(),
          hours_back=st.integers(1, 24))  # fmt: skip
    @timed
    def kill_an_action(self, point: str, by_sensor: bool, hours_back: int) -> None:
        """An operator action killed at one of its intent or effect points, then finished by the
        same command run again or, once its intent is stale, by the sensor's recovery."""
        fired: list[str] = []

        def die_at(reached: str, archive: str | None) -> None:
            if reached == point and not fired:
                fired.append(reached)
                raise Killed(point)

        kind = point.split("_")[0]
        job = self.newest_flip() if kind == "rollback" else None
        before = self.factor
        with faults.hooked(die_at):
            try:
                if kind == "rewind":
                    self.rewound(hours_back)
                elif kind == "rollback" and job is not None:
                    self.world.ops.rollback(HOURLY, job.job_id)
                elif kind == "column":
                    self.change_formula()
                elif kind == "retention":
                    self.retain(1)
                elif kind == "merge":
                    self.upsert(self.late_rows([(333, 21.0)]), "late")
            except Killed:
                pass
            except RollbackRefusedError:
                FIGURES["rollback_refused"] += 1
        self.factor = before  # a killed change applied nothing the model can know of yet
        if fired:
            self.finish(kind, by_sensor, job)
        self.settled = False
        FIGURES[
            f"kill_{point}_{'sensor' if by_sensor else 'command'}" if fired else "kill_idle"
        ] += 1

    def finish(self, kind: str, by_sensor: bool, job) -> None:
        """What finishes an action killed halfway: the sensor's recovery (its intent aged past
        `STALE_AFTER`) or the same command again."""
        engine = (
            self.engine_for(2.0 if self.factor == 1.0 else 1.0)
            if kind == "column"
            else (self.world.engine)
        )
        if by_sensor and kind != "retention":
            recover(engine, actor="test", now=datetime.now(UTC) + 2 * STALE_AFTER)
        elif kind == "rewind":
            self.world.ops.finish_interrupted(HOURLY)
        elif kind == "rollback" and job is not None:
            try:
                self.world.ops.rollback(HOURLY, job.job_id)
            except RollbackRefusedError:
                FIGURES["rollback_refused"] += 1
        elif kind == "column":
            self.world.ops.finish_interrupted("energy_raw")
        if kind == "retention":
            self.retain(1)  # the next pass (maintenance) drops what the killed one recorded
        if kind == "column":
            applied = self.world.engine.raw.applied(self.world.catalog.raw["energy_raw"])
            formula = applied.column("current_a").formula
            self.factor = 2.0 if formula is not None and "* 2" in formula.text else 1.0
        if kind == "retention":
            self.drop_retained()
        if kind == "rollback" and job is not None:
            done = self.world.engine.ledger.snapshot().last_rollback(HOURLY)
            if done is not None and done.undoes == job.job_id:
                cells = cells_of(self.world.catalog.rollup(HOURLY), done)
                self.recompute_rolled_back(cells.windows, cells.entities)

    # -- invariants ------------------------------------------------------------------------------

    @invariant()
    def readers_see_each_cell_once_at_its_active_generation(self) -> None:
        FIGURES["steps"] += 1
        engine = self.world.engine
        for name in ROLLUPS:
            spec = engine.catalog.rollup(name)
            state = engine.states.get(name)
            if state.status is not ArchiveStatus.ACTIVATED:
                continue
            rows = engine.rollups.read_arrow(spec, columns=["entity_id", "bucket_start"])
            cells = list(
                zip(rows["entity_id"].to_pylist(), rows["bucket_start"].to_pylist(), strict=True)
            )
            assert len(cells) == len(set(cells)), f"{name}: a cell read twice"
            FIGURES["cells_read"] += len(cells)

    @invariant()
    def quiet_means_equal_to_the_model_and_nothing_open(self) -> None:
        if not self.settled:
            return
        engine = self.world.engine
        snapshot = engine.ledger.snapshot()
        active = [j for j in snapshot.jobs.values() if not j.state.terminal]
        assert active == [], f"jobs left open once quiet: {active}"
        open_actions = {n: s.intent for n, s in engine.states.all().items() if s.intent}
        assert open_actions == {}, open_actions
        # Work the system queued is never given up (a refused request by hand may be).
        given_up = [
            j for j in snapshot.jobs.values() if j.gave_up and j.trigger is not Trigger.MANUAL
        ]
        assert given_up == [], f"work given up: {given_up}"
        raw = self.model.assign(
            power_kw=4 * self.model["energy_kwh"], voltage_v=220 + self.model["energy_kwh"]
        )
        # The computed column, by the formula the table applies now.
        raw = raw.assign(current_a=raw["power_kw"] * 1000 / raw["voltage_v"] * self.factor)
        removed = engine.removed_spans(self.world.catalog.raw["energy_raw"])
        problems = compare_all(self.world.query, raw, self.world.catalog, removed=removed)
        assert problems == [], problems
        for name in ROLLUPS:
            assert dangling_pointers(engine, engine.catalog.rollup(name), raw) == []
        FIGURES["quiet_checks"] += 1

    @invariant()
    def the_history_agrees_with_what_ran(self) -> None:
        engine, instance = self.world.engine, self.world.instance
        snapshot = engine.ledger.snapshot()
        for name in ROLLUPS:
            spec = engine.catalog.rollup(name)
            pointers, _ = read_pointers(engine.rollups.genmap_uri(spec), engine.rollups.options)
            for job_id in set(pointers["job_id"].to_pylist()):
                job = snapshot.jobs.get(job_id)
                assert job is not None and job.state in (JobState.COMPLETED, JobState.SWAPPING), (
                    name,
                    job_id,
                    job,
                )
        run_ids = {j.run_id for j in snapshot.jobs.values() if j.run_id}
        known = {
            r.dagster_run.run_id
            for r in instance.get_run_records(filters=dg.RunsFilter(run_ids=sorted(run_ids)))
        }
        # A rollback's or an operator's run id is its actor, not a Dagster run.
        assert run_ids - {"test", "cli"} <= known, run_ids - known


@contextmanager
def faults_at(point: str) -> Iterator[None]:
    faults.arm(faults.Fault(point, "raise", HOURLY))
    try:
        yield
    finally:
        faults.arm(None)


ROOT = ""
TEMPLATE = ""


def build_template(root: Path) -> Path:
    """One backfilled warehouse and Dagster home, which every sequence starts from a copy of."""
    with opened(root) as world:
        create(world)
        assert compare_all(world.query, world.raw(), world.catalog) == []
    return root


def prepare(tmp_path: Path) -> None:
    """The template every sequence starts from a copy of, under `tmp_path`; figures zeroed."""
    global ROOT, TEMPLATE
    ROOT = str(tmp_path)
    TEMPLATE = str(build_template(tmp_path / "template"))
    FIGURES.clear()


def run_machine(tmp_path: Path, examples: int, steps: int, seed: int) -> None:
    """`examples` sequences of up to `steps` operations; the same ones for the same `seed` (a
    failing one is shrunk and reported as the steps that reproduce it)."""
    prepare(tmp_path)
    t0 = time.monotonic()
    # A fixed seed, not derandomize: derandomized generation starts from the simplest sequence
    # (one argument-free operation over and over), which a budget of a few sequences cannot
    # afford.
    machine = type("Rollups", (Rollups,), {"_hypothesis_internal_use_seed": seed})
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate, Phase.shrink],
            suppress_health_check=list(HealthCheck),
        ),
    )
    interleavings = sum(v for k, v in FIGURES.items() if k.startswith("interleave_") and
                        not k.endswith("not_reached") and not k.endswith("_s"))  # fmt: skip
    kills = sum(v for k, v in FIGURES.items() if k.startswith("kill_") and not k.endswith("_s")
                and k not in ("kill_not_reached", "kill_idle"))  # fmt: skip
    figures = {
        "seed": seed,
        "examples": examples,
        "steps_per_sequence": steps,
        "seconds": round(time.monotonic() - t0),
        "interleavings": interleavings,
        "kills": kills,
        **dict(sorted(FIGURES.items())),
    }
    print(f"\nstateful model test: {json.dumps(figures)}")
    REPO_ARTIFACTS.mkdir(exist_ok=True)
    name = "stateful-soak.json" if examples > 3 else "stateful.json"
    (REPO_ARTIFACTS / name).write_text(json.dumps(figures, indent=2) + "\n")
    assert FIGURES["sequences"] >= examples and FIGURES["steps"] > 0


def fold_early(monkeypatch: pytest.MonkeyPatch) -> None:
    """With three meters a bucket holds three cell pointers at most: maintenance folds the
    partitions whose buckets carry two, so random sequences fold too; and once a week has
    passed (`WINDOW_PASSED`), the flips before it may no longer be rolled back."""
    monkeypatch.setattr("rollup_assets.model.cells.FOLD_MIN_POINTERS", 2)
    real = Keeping.may_roll_back

    def may_roll_back(self: Keeping, flipped_at: datetime, now: datetime) -> bool:
        if WINDOW_PASSED and flipped_at <= WINDOW_PASSED[-1]:
            return False
        return real(self, flipped_at, now)

    monkeypatch.setattr(Keeping, "may_roll_back", may_roll_back)


@pytest.mark.timeout(1800)
def test_random_operation_sequences_keep_every_invariant(
    tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    fold_early(monkeypatch)
    run_machine(tmp_path, examples=2, steps=10, seed=20251103)


@pytest.mark.soak
@pytest.mark.timeout(0)
def test_soak_random_operation_sequences_keep_every_invariant(
    tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch
) -> None:
    fold_early(monkeypatch)
    run_machine(
        tmp_path,
        examples=int(os.environ.get("ROLLUPS_SOAK_SEQUENCES", "25")),
        steps=int(os.environ.get("ROLLUPS_SOAK_STEPS", "20")),
        seed=int(os.environ.get("ROLLUPS_SOAK_SEED", "7")),
    )


@pytest.mark.soak
@pytest.mark.timeout(0)
@pytest.mark.parametrize("point", JOB_POINTS)
def test_soak_every_action_at_a_point_of_a_running_job(
    tmp_path: Path, spark, monkeypatch: pytest.MonkeyPatch, point: str
) -> None:
    """Every operator action once at `point` of a running recompute, each from a copy of the
    template, checked after the step and once settled, as a random sequence is: every pair is
    covered whatever the random draws reach."""
    fold_early(monkeypatch)
    prepare(tmp_path)
    for action in ACTIONS:
        machine = Rollups()
        try:
            machine.action_during_a_job(point, action, hours_back=6, days=1, slot=200, value=3.5)
            machine.readers_see_each_cell_once_at_its_active_generation()
            machine.the_history_agrees_with_what_ran()
        finally:
            machine.teardown()
        assert FIGURES[f"interleave_{action}_at_{point}"] == 1, (action, point)
