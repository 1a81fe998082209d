"""Progress lines: drawn on a terminal, throttled, silent in pipes and with --quiet; what
`export` reports while it reads and writes, and the line it draws on a terminal."""

import io
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import rollup_assets.cli.progress as progress
import rollup_assets.services.archive_io as archive_io
from rollup_assets.cli.progress import Meter
from rollup_assets.demo.sample_data import SCHEMA
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow
from tests.unit.test_archive_io import source  # noqa: F401
from tests.unit.test_cli import Invoke, as_json, rollups  # noqa: F401


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def frames(out: Terminal) -> list[list[str]]:
    """What each line of the terminal showed, redraw by redraw (each starts with a \\r)."""
    return [line.split("\r")[1:] for line in out.getvalue().split("\n")]


def test_a_terminal_sees_counts_and_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.0, 1.0, 1.05, 2.0, 3.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = Terminal()
    meter = Meter("ingest readings.parquet", stream=out)
    meter("validating", 250_000)  # t=0
    meter("validating", 500_000)  # t=1: 500,000 rows in 1 s
    meter("validating", 510_000)  # t=1.05: within the redraw interval, not drawn yet
    meter("upserting", 250_000)  # t=2: the phase's last figures first, then the new phase
    meter("upserting", 500_000)  # t=3: 500,000 rows in 1 s since the phase began
    meter.close()
    [line, end] = frames(out)
    assert [f.rstrip() for f in line] == [
        "ingest readings.parquet: validating 250,000 rows",
        "ingest readings.parquet: validating 500,000 rows (500,000 rows/s)",
        "ingest readings.parquet: validating 510,000 rows (485,714 rows/s)",
        "ingest readings.parquet: upserting 250,000 rows",
        "ingest readings.parquet: upserting 500,000 rows (500,000 rows/s)",
    ]
    assert end == [] and out.getvalue().endswith("\n")


def test_each_level_keeps_its_line_with_its_own_total(monkeypatch: pytest.MonkeyPatch) -> None:
    """A chain's levels, one line each: done of the level's total, the level's own rate, and
    the last figures of a level even when they came within the redraw interval."""
    clock = iter([0.0, 0.0, 4.0, 4.0, 4.1, 6.0, 7.0, 9.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = Terminal()
    meter = Meter("materialize", unit="partitions", stream=out, line_per_phase=True)
    meter("energy_hourly", 0, 8_784)  # t=0
    meter("energy_hourly", 8_784, 8_784)  # t=4: the whole level in 4 s
    meter("energy_daily", 0, 366)  # t=4
    meter("energy_daily", 366, 366)  # t=4.1: within the interval; still shown
    meter.close()
    meter("energy_weekly", 53)  # after close, on a line of its own, no total known (t=6)
    meter("energy_monthly", 0, 12)  # t=7
    meter("energy_monthly", 3, 12)  # t=9: a slow rate keeps a decimal
    meter.close()
    lines = frames(out)
    assert [line[-1].rstrip() for line in lines if line] == [
        "materialize: energy_hourly 8,784 of 8,784 partitions (2,196 partitions/s)",
        "materialize: energy_daily 366 of 366 partitions (3,660 partitions/s)",
        "materialize: energy_weekly 53 partitions",
        "materialize: energy_monthly 3 of 12 partitions (1.5 partitions/s)",
    ]
    assert lines[0][0].rstrip() == "materialize: energy_hourly 0 of 8,784 partitions"
    assert out.getvalue().endswith("\n")


@pytest.mark.parametrize("quiet", [True, False])
def test_pipes_and_quiet_get_nothing(quiet: bool) -> None:
    out = Terminal() if quiet else io.StringIO()
    meter = Meter("backup", unit="tables", total=3, quiet=quiet, stream=out)
    meter("copying", 1)
    meter("copying", 2, 3)
    meter.close()
    assert out.getvalue() == ""


def test_export_reports_rows_read_then_each_row_group_written(
    source: Engine,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(archive_io, "EXPORT_ROW_GROUP", 20)
    heard: list[tuple] = []
    out = tmp_path / "meter.parquet"
    manifest = archive_io.export_archive(
        source, "meter_raw", str(out), progress=lambda *call: heard.append(call)
    )
    rows = query_arrow(source, "meter_raw").num_rows
    assert manifest.rows == rows == 72
    assert heard == [
        ("reading", 0),
        ("reading", 72),
        ("writing", 0, 72),
        ("writing", 20, 72),
        ("writing", 40, 72),
        ("writing", 60, 72),
        ("writing", 72, 72),
    ]
    meta = pq.read_metadata(out)
    assert (meta.num_rows, meta.num_row_groups) == (72, 4)
    assert pq.read_table(out).equals(
        query_arrow(source, "meter_raw").replace_schema_metadata(pq.read_schema(out).metadata)
    )


@pytest.mark.parametrize("quiet", [False, True])
def test_export_on_a_terminal(
    rollups: Invoke,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    quiet: bool,
) -> None:
    """The command's line on a terminal's stderr; none with --quiet; the data on stdout."""
    batch = tmp_path / "batch.parquet"
    readings = [
        {"entity_id": f"m{m}", "ts": datetime(2025, 6, 1, h, tzinfo=UTC), "energy_kwh": h + m}
        for m in range(3)
        for h in range(5)
    ]
    pq.write_table(pa.Table.from_pylist(readings, schema=SCHEMA), batch)
    as_json(rollups("activate", "energy_raw", "--format", "json"))
    as_json(rollups("ingest", "energy_raw", batch, "--format", "json"))
    term = Terminal()
    monkeypatch.setattr(progress, "sys", SimpleNamespace(stderr=term))
    out = tmp_path / "raw.parquet"
    args = ["export", "energy_raw", out, "--format", "json", *(["--quiet"] if quiet else [])]
    [exported] = as_json(rollups(*args))
    assert exported["rows"] == 15 == pq.read_metadata(out).num_rows
    if quiet:
        assert term.getvalue() == ""
    else:
        [line, end] = frames(term)
        assert line[-1].startswith("export energy_raw: writing 15 of 15 rows")
        assert any(f.startswith("export energy_raw: reading 15 rows") for f in line)
        assert end == []
