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


class _OneLineUsageError(click.ClickException):
    """A usage error (missing option, bad choice, unknown command) shown as one stderr line."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class RollupsGroup(click.Group):
    """Reports click's own usage errors as one line, like every other bad-input error."""

    @staticmethod
    def _one_line(exc: click.UsageError) -> click.ClickException:
        if isinstance(exc, click.exceptions.NoArgsIsHelpError):
            return exc  # bare `rollups`: print the help
        hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
        return _OneLineUsageError(exc.format_message() + hint)

    def make_context(self, *args: Any, **kwargs: Any) -> click.Context:
        try:
            return super().make_context(*args, **kwargs)
        except click.UsageError as exc:
            raise self._one_line(exc) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            raise self._one_line(exc) from None


@click.group(cls=RollupsGroup, context_settings={"help_option_names": ["-h", "--help"]})
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
    # `python -m rollup_assets.cli`: this module runs as __main__, but the sub-commands registered
    # themselves on the importable `rollup_assets.cli.main`.
    from rollup_assets.cli import main as registered

    registered()
