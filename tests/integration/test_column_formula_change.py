"""A computed column's new formula, applied online, reaches every level of the chain: the
first-level rollups over it are recomputed and each level equals the oracle over the new values.
"""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pytest
import yaml

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.spec_loader import parse_catalog
from rollup_assets.model.windows import Window
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.columns import ColumnAction, change_column
from rollup_assets.services.engine import Engine
from rollup_assets.services.verify import raw_frame
from rollup_assets.settings import DEFAULT_SPECS
from tests.conftest import World, days
from tests.oracle import compare_all

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
FIRST = date(2025, 10, 24)  # the autumn DST switch inside the range
DAYS = 5


def test_a_new_formula_is_recomputed_up_the_chain(world: World) -> None:
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(pa.concat_tables([day_batch(d, 3, seed=5) for d in days(FIRST, DAYS)]))
    world.activate_all(NOW)
    start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
    world.backfill([Window(start, start + timedelta(days=DAYS))])
    world.tick(NOW)
    before = world.query("energy_daily")["current_a_max"].to_pylist()

    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    doc["raw_archives"]["energy_raw"]["columns"]["current_a"]["formula"] = (
        "power_kw * 1000 / voltage_v * 1.5"
    )
    changed = parse_catalog(doc, origin="changed")
    engine = Engine(changed, Warehouse(world.engine.raw.warehouse.root))
    result = change_column(engine, "energy_raw", "current_a", ColumnAction.SET_FORMULA)
    assert result.recomputed == ["energy_hourly"]

    world.tick(NOW)
    # Change detection read the switch commit and queued the hourly recompute, once.
    jobs = world.engine.ledger.snapshot().for_rollup("energy_hourly")
    done = [j for j in jobs if j.source_version == result.version and j.trigger is Trigger.PERIODIC]
    assert len(done) == 1 and done[0].state is JobState.COMPLETED
    after = world.query("energy_daily")["current_a_max"].to_pylist()
    assert before and all(b is not None for b in before)
    assert after == pytest.approx([b * 1.5 for b in before], rel=1e-9)
    raw = engine.raw.read_arrow(changed.raw["energy_raw"])
    applied = engine.raw.applied(changed.raw["energy_raw"])
    assert compare_all(world.query, raw_frame(raw, applied), changed) == []
