"""The spec file command: validate the specs and their tenants' warehouse roots."""

import click

from rollup_assets.cli.app import FORMATS, catalog, echo_data, handle_errors, main, settings


@main.command()
@click.option("--format", "fmt", type=FORMATS, default="table")
@handle_errors
def validate(fmt: str) -> None:
    """Load and validate the spec file, and its tenants' warehouse roots against
    ROLLUPS_WAREHOUSE; list the archives it declares."""
    from rollup_assets.model.describe import describe
    from rollup_assets.resources.warehouse import Warehouse, tenant_warehouses

    c = catalog()
    tenant_warehouses(Warehouse(settings().warehouse), c)  # roots that overlap are refused
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
