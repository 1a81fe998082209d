"""Changing the rows of a raw or time-range archive: ingest a file, preview what an ingest
would change, delete rows."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    echo_data,
    engine,
    handle_errors,
    main,
    tenant_option,
    time_range,
)
from rollup_assets.cli.progress import QUIET
from rollup_assets.model.windows import iso_utc

SOURCES = click.Choice(["Manual", "Pipeline", "Import"])


@main.command()
@click.argument("archive")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--change-source",
    type=SOURCES,
    default="Pipeline",
    show_default=True,
    help="Provenance recorded with the commit (shown in job history).",
)
@click.option(
    "--spark",
    "with_spark",
    is_flag=True,
    help="Read FILE with Spark and upsert it with delta-spark's MERGE on the executors (for a "
    "file larger than this process should hold; same rules, one commit).",
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def ingest(
    archive: str, file: str, change_source: str, with_spark: bool, fmt: str, quiet: bool
) -> None:
    """Upsert a Parquet or CSV FILE into a raw or time-range ARCHIVE (all or nothing). On a
    terminal, a progress line counts the rows validated, then upserted, and their rate."""
    from rollup_assets.cli.progress import Meter
    from rollup_assets.model.jobs import ChangeSource
    from rollup_assets.services.ingest import ingest_file, ingest_with_spark

    if with_spark:
        from rollup_assets.cli.app import spark_session

        source = ChangeSource(change_source)
        result = ingest_with_spark(engine(), spark_session(), archive, file, source)
    else:
        meter = Meter(f"ingest {file}", quiet=quiet)
        try:
            result = ingest_file(engine(), archive, file, ChangeSource(change_source), meter)
        finally:
            meter.close()
    row = {
        "archive": archive,
        "version": result.version,
        "rows": result.rows,
        "inserted": result.inserted,
        "updated": result.updated,
        "unchanged": result.unchanged,
        "entities": result.entities,
        "min_ts": iso_utc(result.min_ts),
        "max_ts": iso_utc(result.max_ts),
        "change_source": change_source,
    }
    echo_data(row, fmt)


@main.command()
@click.argument("archive")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option(
    "--format",
    "fmt",
    type=FORMATS,
    default="table",
    help="table: the rows inserted/updated/unchanged, the work per level, then one row per "
    "changed value; csv: the changed values; "
    "json: everything, each cell with its old and new values.",
)
@tenant_option
@handle_errors
def preview(archive: str, file: str, fmt: str) -> None:
    """Dry run of `rollups ingest ARCHIVE FILE`: validate FILE as the ingest does, and list the
    cells of every level the ingest and the recomputes it causes would change (old and new
    values, frozen cells marked held, cells the correction aggregates again from their source
    marked refill) and the work each level would do (cells, technique and why, rows to read).
    Writes nothing."""
    import json

    from rollup_assets.services.preview import preview_ingest

    p = preview_ingest(engine(), archive, file)
    summary = {
        "archive": p.archive,
        "version": p.version,
        "rows": p.rows,
        "inserted": p.inserted,
        "updated": p.updated,
        "unchanged": p.unchanged,
    }
    work = [
        {
            "level": w.level,
            "rollup": w.rollup,
            "cells": w.cells,
            "buckets": w.buckets,
            "cells_changed": w.cells_changed,
            "held_cells": w.held_cells,
            "technique": w.technique,
            "rows_to_read": w.rows_to_read,
            "forward_rows": w.forward_rows,
            "reason": w.reason,
        }
        for w in p.work
    ]
    cells = [
        {
            "level": c.level,
            "rollup": c.rollup,
            "bucket": str(c.bucket),
            "entity": c.entity,
            "held": c.held,
            "refill": c.refill,
            "old": c.old,
            "new": c.new,
        }
        for c in p.cells
    ]
    if fmt == "json":
        click.echo(json.dumps({**summary, "work": work, "cells": cells}, indent=2, default=str))
        return
    values = [
        {
            "level": c.level,
            "rollup": c.rollup,
            "bucket": str(c.bucket),
            "entity": c.entity,
            "column": name,
            "old": (c.old or {}).get(name),
            "new": (c.new or {}).get(name),
            "held": c.held,
            "refill": c.refill,
        }
        for c in p.cells
        for name in dict.fromkeys([*(c.old or {}), *(c.new or {})])
        if (c.old or {}).get(name) != (c.new or {}).get(name) or c.refill
    ]
    if fmt == "csv":
        echo_data(values, fmt)
        return
    echo_data(summary, fmt)
    click.echo()
    echo_data(work, fmt)
    click.echo()
    echo_data(values, fmt)


@main.command("delete-rows")
@click.argument("archive")
@click.option("--from", "start", required=True, help="Rows at or after this instant (ISO-8601).")
@click.option("--to", "end", required=True, help="Rows before this instant.")
@click.option("--entity", "entities", multiple=True, help="Only this entity id (repeatable).")
@click.option(
    "--retention",
    is_flag=True,
    help="Old rows dropped on purpose: the rollups keep what they aggregated from them.",
)
@click.option("--change-source", type=SOURCES, default="Manual", show_default=True)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def delete_rows_command(
    archive: str,
    start: str,
    end: str,
    entities: tuple[str, ...],
    retention: bool,
    change_source: str,
    fmt: str,
) -> None:
    """Delete the rows of a raw or time-range ARCHIVE in [--from, --to) in one commit.

    Without --retention the delete is a correction: the sensors update every level as for any
    other change. With --retention the rollups keep what they aggregated from those rows.
    """
    from rollup_assets.model.jobs import ChangeSource
    from rollup_assets.model.windows import Window
    from rollup_assets.services.ingest import delete_rows

    a, b = time_range(start, end)
    if a is None or b is None:
        raise click.UsageError("--from and --to are required")
    version, deleted = delete_rows(
        engine(),
        archive,
        Window(a, b),
        frozenset(entities) or None,
        ChangeSource(change_source),
        retention=retention,
    )
    row = {
        "archive": archive,
        "version": version,
        "deleted": deleted,
        "kind": "retention" if retention else "correction",
    }
    echo_data(row, fmt)
