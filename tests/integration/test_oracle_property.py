"""Oracle property (DESIGN §3.1 and §3.4; issue 6 item 6): random data, random corrections.

Hypothesis draws a small dataset (1-3 meters, three UTC days around a Vienna DST switch, a month
end and an ISO week boundary, or the leap day; missing readings and nulls in the optional
columns) and a sequence of corrections in one or two waves: changed readings, inserted readings
between the 15-minute slots, late rows for days never aggregated, readings whose optional values
are null (the upsert keeps the stored ones), and meters that appear only later. After each wave
the retroactive sensor ticks until quiet; then every level must equal the pandas oracle.

`NOW` lies in 2026, so every bucket of the 2024 data is below every rollup's watermark: all of it
is the recompute lane's, and only the retroactive sensor is ticked (the forward lane would only
close and refresh empty buckets around `NOW`), which keeps an example to about ten Spark runs.
Examples are derandomized (the same ones run every time) and not shrunk: a failure reports the
generated example, since every replay costs several Spark runs.
"""

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import SCHEMA, day_batch, meter_ids
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import Settings
from tests.conftest import World, days, instance_in
from tests.oracle import compare_all, oracle

NOW = datetime(2026, 1, 15, 12, 0, tzinfo=UTC)
# First UTC day of the three: the DST start (Sunday 2024-03-31, 23 h, then Monday April 1: new
# ISO week and month), the DST end (Sunday 2024-10-27, 25 h, then a new ISO week), the leap day.
ANCHORS = [date(2024, 3, 30), date(2024, 10, 26), date(2024, 2, 28)]
DAYS = 3
KINDS = ("modify", "insert", "late", "nulls", "new_meter")
FIGURES = {"examples": 0, "waves": 0, "corrections": 0, "rows": 0, "rollup_rows_compared": 0}


@dataclass(frozen=True)
class Correction:
    kind: str
    meter: int
    day: int  # offset from the anchor; -1 and DAYS are days without data (never aggregated)
    slot: int  # first 15-minute slot of the day
    length: int  # readings
    seed: int


@dataclass(frozen=True)
class Example:
    anchor: date
    meters: int
    seed: int
    missing: float
    nulls: float
    waves: list[list[Correction]]


corrections = st.builds(
    Correction,
    kind=st.sampled_from(KINDS),
    meter=st.integers(0, 2),
    day=st.integers(-1, DAYS),
    slot=st.integers(0, 95),
    length=st.integers(1, 12),
    seed=st.integers(0, 2**16),
)


def examples(max_corrections: int, max_waves: int) -> st.SearchStrategy[Example]:
    return st.builds(
        Example,
        anchor=st.sampled_from(ANCHORS),
        meters=st.integers(1, 3),
        seed=st.integers(0, 2**16),
        missing=st.sampled_from([0.0, 0.05]),
        nulls=st.sampled_from([0.0, 0.2]),
        waves=st.lists(
            st.lists(corrections, min_size=1, max_size=max_corrections),
            min_size=1,
            max_size=max_waves,
        ),
    )


def dataset(ex: Example) -> pa.Table:
    return pa.concat_tables(
        [
            day_batch(d, ex.meters, ex.seed, ex.missing, ex.nulls, ex.nulls)
            for d in days(ex.anchor, DAYS)
        ]
    )


def correction_batch(ex: Example, c: Correction) -> pa.Table:
    rng = np.random.default_rng(c.seed)
    ids = meter_ids(ex.meters + 1)
    meter = ids[ex.meters] if c.kind == "new_meter" else ids[c.meter % ex.meters]
    day = ex.anchor + timedelta(days=c.day)
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    # Inserts fall between the readings (new keys); the others hit the reading slots.
    offset = timedelta(minutes=7) if c.kind in ("insert", "new_meter") else timedelta(0)
    rows = []
    for s in range(c.slot, c.slot + c.length):
        null_optional = c.kind == "nulls" or rng.random() < 0.2
        rows.append(
            {
                "entity_id": meter,
                "ts": start + timedelta(minutes=15 * s) + offset,
                "energy_kwh": round(float(rng.uniform(0.0, 5.0)), 3),
                "power_kw": None if null_optional else round(float(rng.uniform(0.0, 20.0)), 3),
                "voltage_v": None if null_optional else round(float(rng.uniform(220.0, 240.0)), 2),
            }
        )
    return pa.Table.from_pylist(rows, schema=SCHEMA)


@contextmanager
def fresh_world(root: Path) -> Iterator[World]:
    """What the `world` fixture builds, once per example (Hypothesis reruns the test body)."""
    wh, home = root / "warehouse", root / "dagster_home"
    home.mkdir(parents=True)
    saved = {k: os.environ.get(k) for k in ("ROLLUPS_WAREHOUSE", "DAGSTER_HOME")}
    os.environ.update(ROLLUPS_WAREHOUSE=str(wh), DAGSTER_HOME=str(home))
    try:
        catalog = load_catalog()
        defs = build_definitions(
            catalog, WarehouseResource(root=str(wh)), settings=Settings.from_env()
        )
        with instance_in(home, catalog) as instance:
            yield World(root, catalog, Engine(catalog, Warehouse(str(wh))), defs, instance)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def check_example(root: Path, ex: Example) -> None:
    with fresh_world(root) as world:
        world.ops.activate("energy_raw", now=NOW)
        world.ingest(dataset(ex), source="Import")
        world.activate_all(NOW)
        start = datetime(ex.anchor.year, ex.anchor.month, ex.anchor.day, tzinfo=UTC)
        world.backfill([Window(start, start + timedelta(days=DAYS))])
        assert compare_all(world.query, world.raw(), world.catalog) == []
        for i, wave in enumerate(ex.waves):
            for c in wave:
                batch = correction_batch(ex, c)
                world.ingest(batch, source="Manual")
                FIGURES["rows"] += batch.num_rows
            world.tick(NOW, sensors=("retroactive_write_sensor",))
            problems = compare_all(world.query, world.raw(), world.catalog)
            assert problems == [], f"after wave {i + 1} of {ex}: {problems}"
            FIGURES["waves"] += 1
            FIGURES["corrections"] += len(wave)
        again = world.tick(NOW, sensors=("retroactive_write_sensor",))
        assert sum(len(r.runs) for r in again) == 0  # quiet: no correction left behind
        raw = world.raw()
        FIGURES["rollup_rows_compared"] += sum(
            len(oracle(raw, spec)) for spec in world.catalog.rollups.values()
        )
        FIGURES["examples"] += 1


def run_property(tmp_path: Path, max_examples: int, max_corrections: int, max_waves: int) -> None:
    for k in FIGURES:
        FIGURES[k] = 0
    counter = iter(range(10**6))

    @settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(examples(max_corrections, max_waves))
    def prop(ex: Example) -> None:
        check_example(tmp_path / f"example-{next(counter)}", ex)

    prop()
    print(f"\noracle property: {json.dumps(FIGURES)}")
    assert FIGURES["examples"] >= max_examples


def test_every_level_equals_the_oracle_after_random_corrections(tmp_path: Path, spark) -> None:
    run_property(tmp_path, max_examples=4, max_corrections=3, max_waves=2)


@pytest.mark.soak
def test_soak_every_level_equals_the_oracle_after_random_corrections(tmp_path: Path, spark) -> None:
    run_property(tmp_path, max_examples=25, max_corrections=5, max_waves=3)
