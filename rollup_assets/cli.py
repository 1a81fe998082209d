"""The `rollups` command: ingest, query, materialize, tick, operator actions and lifecycle.

Every command exits non-zero with a one-line reason on bad input; commands that print data
accept `--format json` (and `csv`/`table` where rows are tabular).
"""

import sys
from collections.abc import Callable
from datetime import datetime
from functools import cache, wraps
from typing import Any

import click

from rollup_assets.cli_format import render
from rollup_assets.clock import parse_instant
from rollup_assets.errors import InvalidTimeRangeError, RollupsError

FORMATS = click.Choice(["table", "json", "csv"])


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except RollupsError as exc:
            _fail(str(exc).splitlines()[0])
        except KeyboardInterrupt:
            _fail("interrupted")
        except RuntimeError as exc:
            if "Java" in str(exc):
                _fail(str(exc))
            raise

    return wrapper


@cache
def catalog():
    from rollup_assets.specs import load_catalog

    return load_catalog()


@cache
def engine():
    from resources.warehouse import Warehouse
    from rollup_assets.engine import Engine

    return Engine(catalog(), Warehouse.from_env())


def ops():
    from rollup_assets.operations import Operations

    return Operations(engine(), actor="cli")


def time_range(start: str | None, end: str | None) -> tuple[datetime | None, datetime | None]:
    a = parse_instant(start, "--from") if start else None
    b = parse_instant(end, "--to") if end else None
    if a is not None and b is not None and a >= b:
        raise InvalidTimeRangeError(f"--from {start} is not before --to {end}")
    return a, b


def echo_data(data: Any, fmt: str, columns: list[str] | None = None) -> None:
    rows = data if isinstance(data, list) else [data]
    click.echo(render(rows, fmt, columns))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Time-series rollups that stay correct (Dagster + Spark + Delta).

    Configuration: ROLLUPS_SPECS (spec file), ROLLUPS_WAREHOUSE (warehouse root, default
    ./warehouse), DAGSTER_HOME (default ./.dagster_home).
    """


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table")
@handle_errors
def validate(fmt: str) -> None:
    """Load and validate the spec file; list the archives it declares."""
    from rollup_assets.factory import describe

    c = catalog()
    rows = [
        {
            "archive": n,
            "kind": c.archive(n).kind.value,
            "source": getattr(c.archive(n), "source", ""),
            "summary": describe(c.archive(n), c).splitlines()[0],
        }
        for n in c.names()
    ]
    echo_data(rows, fmt)
    if fmt == "table":
        click.echo(f"{len(rows)} archive(s) valid in {c.origin}")


from rollup_assets import cli_commands  # noqa: E402,F401  (registers the remaining commands)

if __name__ == "__main__":
    main()
