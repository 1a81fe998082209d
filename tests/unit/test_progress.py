"""Progress lines: drawn on a terminal, throttled, silent in pipes and with --quiet."""

import io

import pytest

import rollup_assets.cli.progress as progress
from rollup_assets.cli.progress import Meter


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_sees_counts_and_rates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([0.0, 0.0, 1.0, 1.05, 2.0, 2.0, 3.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    out = Terminal()
    meter = Meter("ingest readings.parquet", stream=out)
    meter("validating", 250_000)  # t=0
    meter("validating", 500_000)  # t=1: 500,000 rows in 1 s
    meter("validating", 510_000)  # t=1.05: within the redraw interval, not drawn
    meter("upserting", 250_000)  # t=2: a new phase restarts the rate
    meter.close()
    lines = out.getvalue().split("\r")
    assert "ingest readings.parquet: validating 500,000 rows (500,000 rows/s)" in lines[2]
    assert not any("510,000" in line for line in lines)
    assert lines[-1].startswith("ingest readings.parquet: upserting 250,000 rows")
    assert out.getvalue().endswith("\n")


@pytest.mark.parametrize("quiet", [True, False])
def test_pipes_and_quiet_get_nothing(quiet: bool) -> None:
    out = Terminal() if quiet else io.StringIO()
    meter = Meter("backup", unit="tables", total=3, quiet=quiet, stream=out)
    meter("copying", 1)
    meter.close()
    assert out.getvalue() == ""
