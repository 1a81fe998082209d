"""The `rollups` command group and what its commands share: error handling, output, and the
process's settings, catalog and engine (built once, on first use).

Every command exits non-zero with a one-line reason on bad input; commands that print data
accept `--format json` (and `csv`/`table` where rows are tabular).
"""

import os
import sys
from collections.abc import Callable
from datetime import datetime
from functools import cache, wraps
from typing import TYPE_CHECKING, Any, NoReturn

import click

from rollup_assets import metrics
from rollup_assets.cli.format import render
from rollup_assets.faults import arm
from rollup_assets.model.errors import InvalidTimeRangeError, RollupsError, TenantError
from rollup_assets.model.windows import parse_instant
from rollup_assets.resources.processes import exit_after_python
from rollup_assets.settings import Settings, SettingsError

if TYPE_CHECKING:
    import dagster as dg
    from pyspark.sql import SparkSession

    from rollup_assets.model.specs import Catalog
    from rollup_assets.orchestration.tenancy import Scope
    from rollup_assets.services.engine import Engine
    from rollup_assets.services.operations import Operations

FORMATS = click.Choice(["table", "json", "csv"])


def _fail(message: str) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(2)


def handle_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (RollupsError, SettingsError) as exc:
            _fail(str(exc).splitlines()[0])
        except KeyboardInterrupt:
            _fail("interrupted")
        except RuntimeError as exc:
            if "Java" in str(exc):
                _fail(str(exc))
            raise

    return wrapper


# One process, one configuration: read from the environment once, on first use.


@cache
def settings() -> Settings:
    configured = Settings.from_env()
    arm(configured.fault)  # a drill or crash test arms this process at its edge
    metrics.configure(configured.metrics)  # flushed when the command's process exits
    return configured


@cache
def catalog() -> "Catalog":
    from rollup_assets.model.spec_loader import load_catalog

    return load_catalog(settings().specs)


class _Chosen:
    """The `--tenant` of the command being run (None when it was not given)."""

    tenant: str | None = None


def _choose_tenant(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    # Click calls this for every command that has the option, given or not, so a command never
    # inherits the tenant of an earlier one run in the same process.
    if value != _Chosen.tenant:
        engine.cache_clear()
    _Chosen.tenant = value


def selection_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--from`, `--to` and `--entity ...`: which rows (buckets) of an archive a command reads."""
    fn = click.option(
        "--entity", "entities", multiple=True, help="Only this entity id (repeatable)."
    )(fn)
    fn = click.option("--to", "end", help="Rows (buckets) starting before this instant.")(fn)
    return click.option(
        "--from",
        "start",
        help="Rows (buckets) starting at or after this instant (ISO-8601; naive = UTC).",
    )(fn)


def tenant_option(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`--tenant NAME` on a command that reads or writes an installation's data or operates it."""
    return click.option(
        "--tenant",
        metavar="NAME",
        expose_value=False,
        callback=_choose_tenant,
        help="The tenant to act for (default: $ROLLUPS_TENANT); required when the spec declares "
        "tenants, refused when it declares none. A command only ever reaches that tenant's "
        "warehouse, runs and ledger.",
    )(fn)


def tenant() -> str | None:
    """The tenant this command acts for (`--tenant`, else $ROLLUPS_TENANT), checked against the
    spec: one of its tenants if it declares any, else none."""
    name = _Chosen.tenant or settings().tenant
    if name is None and catalog().tenants:
        raise TenantError(
            f"{catalog().origin} declares tenants ({', '.join(catalog().tenants)}): "
            "pass --tenant NAME or set ROLLUPS_TENANT"
        )
    catalog().tenant(name)
    return name


def scope() -> "Scope":
    """The Dagster names of the tenant this command acts for (jobs, sensors, ops)."""
    from rollup_assets.orchestration.tenancy import Scope

    return Scope(tenant())


@cache
def engine() -> "Engine":
    """The engine over the warehouse of the tenant the command acts for (the configured
    warehouse itself when the spec declares no tenants)."""
    from rollup_assets.resources.warehouse import Warehouse, tenant_warehouse
    from rollup_assets.services.engine import Engine

    base = Warehouse(settings().warehouse)
    return Engine.from_settings(catalog(), tenant_warehouse(base, catalog(), tenant()), settings())


def ops() -> "Operations":
    from rollup_assets.services.operations import Operations

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
    ./warehouse), DAGSTER_HOME (default ./.dagster_home), ROLLUPS_TENANT (the tenant of a spec
    that declares tenants, when a command's --tenant is not given).
    """


def run() -> NoReturn:
    """The `rollups` console script: `main`, then the process ends once Python's own exit work
    is done, without the native libraries' static destructors (`exit_after_python`)."""
    try:
        main()
    except SystemExit as exc:
        code = _status(exc.code)
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    else:
        code = 0
    exit_after_python(code)


def _status(code: object) -> int:
    """The exit status `sys.exit(code)` gives."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def runs_context() -> tuple["dg.Definitions", "dg.DagsterInstance"]:
    """The code location and the Dagster instance, for commands that execute runs in this
    process; starts the one Spark session every run of the command shares."""
    from rollup_assets.definitions import defs
    from rollup_assets.orchestration.instance import (
        ensure_pools,
        get_instance,
        use_range_event_settings,
    )

    use_range_event_settings(os.environ)  # Dagster reads them when this process creates a run
    instance = get_instance(settings())
    ensure_pools(instance, catalog())
    spark_session()  # one session for every run of this command
    return defs, instance


def spark_session() -> "SparkSession":
    """The process's Spark session as the settings configure it: the warm server's when it is
    up, else a Spark Connect URL or a local master (started on the first call)."""
    from rollup_assets.resources.spark import build_session
    from rollup_assets.resources.spark_server import usable_url

    s = settings()
    remote = s.spark_remote or (usable_url(s.warm_spark_dir) if s.uses_warm_spark else None)
    return build_session(
        master=s.spark_master,
        remote=remote,
        delta_jars=s.delta_jars,
        python=s.pyspark_python,
        java_home=s.java_home,
    )
