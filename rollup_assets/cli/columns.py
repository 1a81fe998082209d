"""Column commands: list an archive's columns, apply a computed column's declared change."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    catalog,
    echo_data,
    engine,
    handle_errors,
    main,
    tenant_option,
)


@main.command()
@click.argument("archive")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def columns(archive: str, fmt: str) -> None:
    """List the columns of ARCHIVE. A raw or time-range archive's columns are ingested or
    computed, each computed one with the formula the spec declares, the formula the table
    applies and what is pending (add, formula, removal: apply it with add-column, set-formula,
    remove-column). A rollup's columns are aggregated, with the partial columns they are
    stored as."""
    from rollup_assets.model.describe import aggregated_columns
    from rollup_assets.model.specs import RollupSpec
    from rollup_assets.services.columns import column_states

    spec = catalog().archive(archive)
    if isinstance(spec, RollupSpec):
        echo_data(aggregated_columns(spec), fmt)
        return
    rows = [
        {
            "column": s.column,
            "type": s.type,
            "status": s.status,
            "formula": s.applied or "",
            "declared": s.declared if s.declared != s.applied else "",
        }
        for s in column_states(engine(), archive)
    ]
    echo_data(rows, fmt)


def _change(archive: str, column: str, action: str, fmt: str) -> None:
    from rollup_assets.services.columns import ColumnAction, change_column

    result = change_column(engine(), archive, column, ColumnAction(action))
    row = {
        "archive": result.archive,
        "column": result.column,
        "action": result.action.value,
        "version": result.version,
        "rows_rewritten": result.rows,
        "rows_reingested": result.reingested,
        # The sensor's change detection reads the switch commit and queues these, once.
        "recomputed_by_detection": ", ".join(result.recomputed) or None,
    }
    echo_data([row], fmt)


@main.command("add-column")
@click.argument("archive")
@click.argument("column")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def add_column(archive: str, column: str, fmt: str) -> None:
    """Add COLUMN, declared in the spec as computed, to the activated ARCHIVE: every row is
    computed into new files readers do not see, then one commit makes the column visible.
    Ingest goes on meanwhile; a failure leaves the archive as it was."""
    _change(archive, column, "add", fmt)


@main.command("set-formula")
@click.argument("archive")
@click.argument("column")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def set_formula(archive: str, column: str, fmt: str) -> None:
    """Apply the formula the spec now declares for computed COLUMN of ARCHIVE: the old values
    keep serving until one commit switches every row to the new ones; the first-level rollups
    aggregating COLUMN are then recomputed (queued as Manual jobs; the chain follows). Refused
    while another computed column reads COLUMN."""
    _change(archive, column, "set-formula", fmt)


@main.command("remove-column")
@click.argument("archive")
@click.argument("column")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def remove_column(archive: str, column: str, fmt: str) -> None:
    """Remove computed COLUMN, no longer declared in the spec, from ARCHIVE in one commit
    (readers stop seeing it). Refused while another computed column reads it."""
    _change(archive, column, "remove", fmt)
