"""The `rollups` command surface: help everywhere, one-line errors, machine-readable output.

Runs in-process with click's runner against a fresh warehouse (no Spark); a few tests run the
real console entry point in a subprocess. The CLI caches its catalog and engine, so the fixture
clears them around each test.
"""

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import click
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner, Result

from rollup_assets.cli import app as cli
from rollup_assets.cli import main
from rollup_assets.demo.sample_data import SCHEMA

COMMANDS = sorted(main.commands)
# Commands that print a notice, a verdict or a story rather than data rows.
NO_DATA = {"setup", "demo", "verify", "dev", "spark-server"}
T1, T2 = "2025-06-01T00:00:00Z", "2025-06-02T00:00:00Z"

Invoke = Callable[..., Result]


@pytest.fixture
def rollups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    (tmp_path / "home").mkdir()
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "warehouse"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("ROLLUPS_SPECS", raising=False)
    monkeypatch.delenv("ROLLUPS_NOW", raising=False)
    cli.settings.cache_clear()
    cli.catalog.cache_clear()
    cli.engine.cache_clear()
    runner = CliRunner()
    yield lambda *args: runner.invoke(main, [str(a) for a in args])
    cli.settings.cache_clear()
    cli.catalog.cache_clear()
    cli.engine.cache_clear()


def assert_one_line_failure(res: Result, *needles: str) -> str:
    """Non-zero exit, nothing on stdout, exactly one line on stderr, no traceback."""
    assert res.exit_code != 0, res.output
    assert isinstance(res.exception, SystemExit), res.exception  # not an uncaught error
    assert res.stdout == ""
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def as_json(res: Result) -> list:
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert isinstance(data, list)
    return data


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_every_command_has_help(rollups: Invoke, command: str | None) -> None:
    res = rollups(*([command] if command else []), "--help")
    assert res.exit_code == 0, res.output
    assert res.stdout.startswith("Usage:") and res.stderr == ""
    if command is None:
        assert all(name in res.stdout for name in COMMANDS)


@pytest.mark.parametrize("command", sorted(set(COMMANDS) - NO_DATA))
def test_commands_that_print_data_offer_json(command: str) -> None:
    options = {opt: p for p in main.commands[command].params for opt in p.opts}
    fmt = options.get("--format")
    assert fmt is not None, f"`rollups {command}` prints data but has no --format"
    assert isinstance(fmt.type, click.Choice) and "json" in fmt.type.choices


@pytest.mark.parametrize("command", ["start", "restart", "status"])
def test_warm_spark_commands_offer_json(command: str) -> None:
    group = main.commands["spark-server"]
    assert isinstance(group, click.Group)
    options = {opt: p for p in group.commands[command].params for opt in p.opts}
    fmt = options.get("--format")
    assert fmt is not None and isinstance(fmt.type, click.Choice) and "json" in fmt.type.choices


BAD = {
    # unknown archive
    "query-unknown": (["query", "nope"], "archive 'nope' is not declared"),
    "jobs-unknown": (["jobs", "nope"], "archive 'nope' is not declared"),
    "publish-unknown": (["publish", "nope"], "archive 'nope' is not declared"),
    "status-unknown": (["status", "nope"], "archive 'nope' is not declared"),
    "freeze-unknown": (["freeze", "nope", "--until", T1], "archive 'nope' is not declared"),
    "unfreeze-unknown": (["unfreeze", "nope"], "archive 'nope' is not declared"),
    "rewind-unknown": (["rewind", "nope", "--to", T1], "archive 'nope' is not declared"),
    "recompute-unknown": (
        ["recompute", "nope", "--from", T1, "--to", T2],
        "archive 'nope' is not declared",
    ),
    "materialize-unknown": (
        ["materialize", "nope", "--from", T1, "--to", T2],
        "archive 'nope' is not declared",
    ),
    "check-unknown": (
        ["check", "nope", "--from", T1, "--to", T2],
        "archive 'nope' is not declared",
    ),
    "activate-unknown": (["activate", "nope"], "archive 'nope' is not declared"),
    "disable-unknown": (["disable", "nope"], "archive 'nope' is not declared"),
    "enable-unknown": (["enable", "nope"], "archive 'nope' is not declared"),
    "delete-unknown": (["delete", "nope"], "archive 'nope' is not declared"),
    "ingest-unknown": (["ingest", "nope", "batch.parquet"], "archive 'nope' is not declared"),
    "export-unknown": (["export", "nope", "out.parquet"], "archive 'nope' is not declared"),
    "import-unknown": (["import", "nope", "out.parquet"], "archive 'nope' is not declared"),
    "rollback-unknown": (["rollback", "nope", "--job", "j"], "archive 'nope' is not declared"),
    "rollback-a-raw-archive": (["rollback", "energy_raw", "--job", "j"], "not a rollup"),
    "rollback-not-activated": (["rollback", "energy_hourly", "--job", "j"], "not activated"),
    "query-as-of-not-activated": (["query", "energy_hourly", "--as-of", T1], "not activated"),
    "freeze-a-raw-archive": (["freeze", "energy_raw", "--until", T1], "not a rollup"),
    # --from after --to
    "query-inverted": (["query", "energy_hourly", "--from", T2, "--to", T1], "is not before"),
    "recompute-inverted": (
        ["recompute", "energy_hourly", "--from", T2, "--to", T1],
        "is not before",
    ),
    "materialize-inverted": (
        ["materialize", "energy_hourly", "--from", T2, "--to", T1],
        "is not before",
    ),
    "check-inverted": (["check", "energy_hourly", "--from", T2, "--to", T1], "is not before"),
    "export-inverted": (
        ["export", "energy_hourly", "x.parquet", "--from", T2, "--to", T1],
        "is not before",
    ),
    "recompute-empty": (["recompute", "energy_hourly", "--from", T1, "--to", T1], "not before"),
    # unparseable times
    "query-bad-from": (["query", "energy_hourly", "--from", "yesterday"], "'yesterday'"),
    # downsampling: steps that do not nest, ranges that are not whole steps
    "query-step-not-nesting": (
        ["query", "energy_monthly", "--every", "week"],
        "cannot downsample 'energy_monthly' (alignment CalendarMonth",
    ),
    "query-step-90m": (["query", "energy_hourly", "--every", "90m"], "--every 90m"),
    "query-step-unknown": (["query", "energy_hourly", "--every", "fortnight"], "not a step"),
    "query-step-misaligned": (
        ["query", "energy_daily", "--every", "month", "--from", T1],
        "not a boundary of the month steps",
    ),
    "query-step-raw-without-agg": (
        ["query", "energy_raw", "--every", "day"],
        "add what to compute: --agg COLUMN:FUNCTION",
    ),
    "query-agg-alone": (["query", "energy_raw", "--agg", "energy_kwh:sum"], "--agg needs --every"),
    "query-zone-alone": (["query", "energy_raw", "--zone", "UTC"], "--zone needs --every"),
    "query-agg-unknown-column": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy:sum"],
        "no column 'energy' (columns: energy_kwh, power_kw, voltage_v, current_a)",
    ),
    "query-agg-unknown-function": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy_kwh:median"],
        "'median' is not an aggregate function (one of sum, min, max, count, avg)",
    ),
    "query-agg-not-column-function": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy_kwh"],
        "--agg 'energy_kwh' is not COLUMN:FUNCTION",
    ),
    "query-agg-bad-step": (
        ["query", "energy_raw", "--every", "fortnight", "--agg", "energy_kwh:sum"],
        "--every 'fortnight' is not a step",
    ),
    "query-agg-bad-zone": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy_kwh:sum", "--zone", "Mars/Base"],
        "--zone 'Mars/Base' is not an IANA time zone",
    ),
    "query-agg-bad-group-by": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy_kwh:sum", "--group-by", "x"],
        "'x' is not one of 'entity', 'all'",
    ),
    "query-agg-twice": (
        [
            "query",
            "energy_raw",
            "--every",
            "1h",
            "--agg",
            "voltage_v:max",
            "--agg",
            "voltage_v:MAX",
        ],
        "voltage_v:max is given twice",
    ),
    "query-raw-realtime-every": (
        ["query", "energy_raw", "--every", "day", "--agg", "energy_kwh:sum", "--realtime"],
        "not a rollup",
    ),
    "query-rollup-other-zone": (
        ["query", "energy_daily", "--every", "month", "--zone", "UTC"],
        "its buckets are kept in Europe/Vienna",
    ),
    "query-rollup-agg-not-kept": (
        ["query", "energy_daily", "--every", "month", "--agg", "power_kw:sum"],
        "keeps no Sum(power_kw)",
    ),
    "query-group-by-alone": (["query", "energy_hourly", "--group-by", "all"], "needs --every"),
    "query-realtime-raw": (["query", "energy_raw", "--realtime"], "not a rollup"),
    "recompute-bad-to": (
        ["recompute", "energy_hourly", "--from", T1, "--to", "2025-13-01"],
        "'2025-13-01'",
    ),
    "freeze-bad-until": (["freeze", "energy_hourly", "--until", "soon"], "--until 'soon'"),
    "rewind-bad-to": (["rewind", "energy_hourly", "--to", "12:00"], "--to '12:00'"),
    "tick-bad-now": (["tick", "--now", "noon"], "--now 'noon'"),
    "query-bad-as-of": (["query", "energy_hourly", "--as-of", "soon"], "--as-of 'soon'"),
    "materialize-bad-from": (
        ["materialize", "energy_hourly", "--from", "x", "--to", T2],
        "--from 'x'",
    ),
    # click's own usage errors are one line too
    "missing-option": (["recompute", "energy_hourly", "--from", T1], "Missing option '--to'"),
    "missing-argument": (["jobs"], "Missing argument 'ROLLUP'"),
    "rollback-missing-job": (["rollback", "energy_hourly"], "Missing option '--job'"),
    "bad-choice": (["jobs", "energy_hourly", "--format", "xml"], "'xml' is not one of"),
    "bad-integer": (["jobs", "energy_hourly", "--limit", "many"], "'many' is not a valid integer"),
    "unknown-command": (["frobnicate"], "No such command 'frobnicate'"),
}


@pytest.mark.parametrize(("args", "needle"), BAD.values(), ids=list(BAD))
def test_bad_arguments_fail_with_one_line(rollups: Invoke, args: list[str], needle: str) -> None:
    assert_one_line_failure(rollups(*args), needle)


def test_columns_shows_ingested_computed_and_aggregated_columns(rollups: Invoke) -> None:
    raw = {r["column"]: r for r in as_json(rollups("columns", "energy_raw", "--format", "json"))}
    assert raw["energy_kwh"]["status"] == "ingested"
    assert raw["current_a"]["status"] == "active"  # not created yet: the spec's formula applies
    assert raw["current_a"]["formula"] == "power_kw * 1000 / voltage_v"
    daily = {
        r["column"]: r for r in as_json(rollups("columns", "energy_daily", "--format", "json"))
    }
    assert daily["current_a_max"]["origin"] == "Max(current_a) of energy_hourly"
    assert daily["power_kw_avg"]["stored_as"] == "power_kw_avg__sum, power_kw_avg__count"
    assert daily["energy_kwh_count"]["type"] == "long"
    assert_one_line_failure(rollups("columns", "nope"), "archive 'nope' is not declared")


def test_publish_builds_the_surface_of_activated_rollups(rollups: Invoke, tmp_path: Path) -> None:
    assert as_json(rollups("publish", "--format", "json")) == []  # nothing activated yet
    assert rollups("activate", "energy_raw").exit_code == 0
    assert rollups("activate", "energy_hourly").exit_code == 0
    (row,) = as_json(rollups("publish", "--format", "json"))
    assert row["rollup"] == "energy_hourly" and row["action"] == "rebuilt"
    assert row["surface"] == str(tmp_path / "warehouse" / "rollups" / "energy_hourly__active")
    assert (row["rows_written"], row["pointer_version"], row["rows_version"]) == (0, -1, -1)
    (again,) = as_json(rollups("publish", "energy_hourly", "--format", "json"))
    assert again["action"] == "up to date"


def test_lifecycle_guards_and_json_output(rollups: Invoke, tmp_path: Path) -> None:
    names = [r["archive"] for r in as_json(rollups("validate", "--format", "json"))]
    assert "energy_raw" in names and "energy_hourly" in names
    status = as_json(rollups("status", "--format", "json"))
    assert {r["archive"]: r["status"] for r in status}["energy_raw"] == "Created"
    assert as_json(rollups("jobs", "energy_hourly", "--format", "json")) == []

    batch = tmp_path / "batch.parquet"
    pq.write_table(
        pa.Table.from_pylist(
            [
                {"entity_id": "m1", "ts": datetime(2025, 6, 1, h, tzinfo=UTC), "energy_kwh": 1.0}
                for h in range(3)
            ],
            schema=SCHEMA,
        ),
        batch,
    )
    # Ingest and query need an activated archive.
    assert_one_line_failure(
        rollups("ingest", "energy_raw", batch), "not activated (status Created)"
    )
    assert_one_line_failure(rollups("query", "energy_raw"), "not activated (status Created)")
    assert_one_line_failure(
        rollups("recompute", "energy_hourly", "--from", T1, "--to", T2), "not activated"
    )
    [failed] = as_json(rollups("jobs", "energy_hourly", "--format", "json"))
    assert (failed["trigger"], failed["state"]) == ("Manual", "Failed")
    assert "not activated (status Created)" in failed["error"]

    [raw] = as_json(rollups("activate", "energy_raw", "--format", "json"))
    assert raw["status"] == "Activated"
    [ingested] = as_json(rollups("ingest", "energy_raw", batch, "--format", "json"))
    assert ingested["rows"] == 3
    rows = as_json(rollups("query", "energy_raw", "--from", T1, "--to", T2, "--format", "json"))
    assert [r["ts"] for r in rows] == [f"2025-06-01T0{h}:00:00Z" for h in range(3)]
    csv = rollups("query", "energy_raw", "--format", "csv")
    assert csv.exit_code == 0 and csv.stdout.splitlines()[0].startswith("entity_id,ts,")
    # Deleting rows: one commit, or none when nothing matches; retention says so.
    one_hour = ("--from", "2025-06-01T01:00:00Z", "--to", "2025-06-01T02:00:00Z")
    [gone] = as_json(rollups("delete-rows", "energy_raw", *one_hour, "--format", "json"))
    assert (gone["deleted"], gone["kind"]) == (1, "correction") and gone["version"] is not None
    [none] = as_json(
        rollups("delete-rows", "energy_raw", *one_hour, "--retention", "--format", "json")
    )
    assert (none["deleted"], none["version"], none["kind"]) == (0, None, "retention")
    assert_one_line_failure(
        rollups("delete-rows", "energy_raw", "--from", T2, "--to", T1), "is not before"
    )
    assert_one_line_failure(
        rollups("delete-rows", "energy_hourly", *one_hour), "rollups are written by the system"
    )
    rows = as_json(rollups("query", "energy_raw", "--from", T1, "--to", T2, "--format", "json"))
    assert [r["ts"] for r in rows] == ["2025-06-01T00:00:00Z", "2025-06-01T02:00:00Z"]

    # Freeze is monotonic; unfreeze records accept_gaps.
    [frozen] = as_json(rollups("freeze", "energy_hourly", "--until", T2, "--format", "json"))
    assert frozen["frozen_until"] == T2
    assert_one_line_failure(rollups("freeze", "energy_hourly", "--until", T1), "monotonic")
    [thawed] = as_json(rollups("unfreeze", "energy_hourly", "--accept-gaps", "--format", "json"))
    assert thawed["frozen_until"] is None and "accept_gaps=true" in thawed["reason"]

    [hourly] = as_json(rollups("activate", "energy_hourly", "--format", "json"))
    assert hourly["status"] == "Activated" and hourly["watermark"]
    # Nothing closed or stored yet: downsampled and real-time reads are empty, not errors.
    for extra in (["--every", "day", "--group-by", "all"], ["--realtime"]):
        result = rollups("query", "energy_hourly", *extra, "--format", "json")
        assert result.exit_code == 0 and json.loads(result.stdout) == [], result.output
    assert_one_line_failure(rollups("delete", "energy_raw"), "energy_hourly")
    [health] = as_json(rollups("status", "energy_hourly", "--format", "json"))
    assert health["status"] == "Activated" and health["dirty_windows_pending"] == 0
    [disabled] = as_json(rollups("disable", "energy_hourly", "--format", "json"))
    assert disabled["status"] == "Disabled"
    assert_one_line_failure(rollups("query", "energy_hourly"), "status Disabled")
    assert_one_line_failure(
        rollups("recompute", "energy_hourly", "--from", T1, "--to", T2), "status Disabled"
    )
    [enabled] = as_json(rollups("enable", "energy_hourly", "--format", "json"))
    assert enabled["status"] == "Activated"
    [report] = as_json(rollups("maintain", "--format", "json"))
    assert report["tables"] >= 1


def test_the_console_entry_point_fails_with_one_line(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLUPS_")}
    env.update(ROLLUPS_WAREHOUSE=str(tmp_path / "warehouse"), DAGSTER_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-m", "rollup_assets.cli", "recompute", "nope", "--from", T2, "--to", T1],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [f"error: --from {T2} is not before --to {T1}"]


# A native library whose exit-time destructor aborts, as Arrow's thread pools can: the C library
# runs `abort` when the process exits through `exit()`.
ABORTING_LIBRARY = """
import atexit, ctypes, sys
libc = ctypes.CDLL(None)
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
atexit.register(lambda: print("atexit handlers ran", file=sys.stderr))
from rollup_assets.cli import run
sys.argv = ["rollups", *sys.argv[1:]]
run()
"""


@pytest.mark.parametrize(
    ("args", "code"),
    [(["validate", "--format", "json"], 0), (["query", "nope", "--format", "json"], 2)],
)
def test_the_console_entry_point_exits_with_its_status_past_native_exit_destructors(
    tmp_path: Path, args: list[str], code: int
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ROLLUPS_")}
    env.update(ROLLUPS_WAREHOUSE=str(tmp_path / "warehouse"), DAGSTER_HOME=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-c", ABORTING_LIBRARY, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert out.returncode == code, out.stderr  # not -6: the native destructors never ran
    assert out.stderr.splitlines()[-1] == "atexit handlers ran"
    if code == 0:
        assert json.loads(out.stdout)  # the whole output, flushed
