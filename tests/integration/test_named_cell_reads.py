"""A read of named cells folds every corrected cell it returns from all of that cell's rows.

Such a read prunes row groups by the named cells, and a row group read for one of them may hold
some rows of another cell and not others (the row table's files are sorted by entity and cut
into row groups by count): here, a late reading's difference row of a meter not asked for, in
the correction's file, while that meter's base row sits in a row group the read skips. Folding
the difference row alone would make a cell of one reading out of it; the read takes every row
of such a cell again before folding it."""

from datetime import UTC, date, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.cells import Cells
from rollup_assets.model.windows import Window
from rollup_assets.resources.delta_files import TargetIndex
from rollup_assets.resources.rollup_reads import RollupReads, Unknown
from tests.conftest import World

NOW = datetime(2025, 11, 15, 12, 0, tzinfo=UTC)
DAY = date(2025, 11, 3)
HOUR = Window(datetime(2025, 11, 3, 9, tzinfo=UTC), datetime(2025, 11, 3, 10, tzinfo=UTC))
ASKED, OTHER = "meter-0000", "meter-0001"


def late(batch: pa.Table) -> pa.ChunkedArray:
    """The first reading of each meter in HOUR: held back, to arrive late."""
    ts = batch["ts"]
    return pc.equal(ts, pa.scalar(HOUR.start, ts.type))


def in_targets(rows: pa.Table, targets: TargetIndex) -> list[bool]:
    out = []
    for entity, start in zip(
        rows["entity_id"].to_pylist(), rows["bucket_start"].to_pylist(), strict=True
    ):
        out.append(
            any(
                w.start <= start < w.end and (scope is None or entity in scope)
                for w, scope in targets.targets
            )
        )
    return out


@pytest.fixture
def row_groups_of_other_cells(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row-group layout in which pruning by the named cells keeps the difference rows of every
    cell (one row group of the correction's file) and the base rows of the named cells alone."""
    real = RollupReads._read_file

    def read_file(self, spec, f, columns=None, targets=None):
        rows = real(self, spec, f, columns, targets)
        if not isinstance(targets, TargetIndex) or rows.num_rows == 0:
            return rows
        delta = pc.fill_null(rows["delta"], False).to_pylist()
        named = in_targets(rows, targets)
        return rows.filter(pa.array([d or n for d, n in zip(delta, named, strict=True)]))

    monkeypatch.setattr(RollupReads, "_read_file", read_file)


def test_a_corrected_cell_read_along_is_folded_from_all_its_rows(
    world: World, row_groups_of_other_cells: None
) -> None:
    batch = day_batch(DAY, 2, seed=3)
    held = late(batch)
    world.ops.activate("energy_raw", now=NOW)
    world.ingest(batch.filter(pc.invert(held)), source="Import")
    world.activate_all(NOW)
    day = datetime(DAY.year, DAY.month, DAY.day, tzinfo=UTC)
    world.backfill([Window(day, day + timedelta(days=1))])
    world.tick(NOW)
    world.ingest(batch.filter(held), source="Manual")  # a late reading of each meter
    world.tick(NOW)

    engine = world.engine
    spec = engine.catalog.rollup("energy_hourly")
    named = Cells(((HOUR, frozenset({ASKED})),))
    got = engine.rollups.read_arrow(spec, [HOUR], cells=named, unknown=Unknown.REFUSE)
    truth = engine.rollups.read_arrow(spec, [HOUR])
    keys = ["entity_id", "bucket_start"]
    wanted = ["entity_id", "bucket_start", "energy_kwh_sum", "energy_kwh_count"]
    by_cell = {tuple(r[k] for k in keys): r for r in truth.select(wanted).to_pylist()}
    assert ASKED in got["entity_id"].to_pylist()
    for row in got.select(wanted).to_pylist():
        # Four readings in the hour: a cell made of the late reading alone would count one.
        assert row == by_cell[tuple(row[k] for k in keys)], row
