"""Data commands: validate the specs, ingest, query and verify."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    catalog,
    echo_data,
    engine,
    handle_errors,
    main,
    selection_options,
    settings,
    spark_session,
    tenant_option,
    time_range,
)
from rollup_assets.cli.format import rows_of
from rollup_assets.cli.progress import QUIET
from rollup_assets.model.windows import iso_utc, parse_instant

SOURCES = click.Choice(["Manual", "Pipeline", "Import"])


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


@main.command()
@click.argument("archive")
@selection_options
@click.option(
    "--every",
    metavar="STEP",
    help="Aggregate into steps of day, week (ISO, from Monday), month, year (in the zone) or a "
    "duration (e.g. 6h, aligned to the Unix epoch). A rollup's buckets are merged (a step must "
    "be a whole number of them); a raw or time-range archive's rows are aggregated (with "
    "--agg). --from/--to must then be step boundaries.",
)
@click.option(
    "--agg",
    "aggs",
    metavar="COLUMN:FUNCTION",
    multiple=True,
    help="With --every: what to compute, repeatable; FUNCTION is sum, min, max, count or avg; "
    "the output column is COLUMN_FUNCTION. Required for a raw or time-range archive; on a "
    "rollup it picks among its aggregations (default: all).",
)
@click.option(
    "--zone",
    metavar="ZONE",
    default=None,
    help="With --every: the IANA zone of calendar steps over a raw or time-range archive "
    "(default UTC); a rollup's steps follow its reference zone.",
)
@click.option(
    "--group-by",
    type=click.Choice(["entity", "all"]),
    default=None,
    help="With --every: one row per step and entity (default), or one per step over all "
    "selected entities (no entity_id column).",
)
@click.option(
    "--realtime",
    is_flag=True,
    help="Rollups: buckets below the watermark as stored, newer ones (the open bucket "
    "included) aggregated from the source now.",
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@click.option("--limit", type=int, default=None, help="Print at most this many rows.")
@click.option(
    "--as-of",
    "as_of",
    default=None,
    help="Read what a reader saw at this instant (ISO-8601; naive is UTC): the table versions "
    "current then. Refused before the archive existed or past what retention keeps.",
)
@tenant_option
@handle_errors
def query(
    archive: str,
    start: str | None,
    end: str | None,
    entities: tuple[str, ...],
    every: str | None,
    aggs: tuple[str, ...],
    zone: str | None,
    group_by: str | None,
    realtime: bool,
    fmt: str,
    limit: int | None,
    as_of: str | None,
) -> None:
    """Read a rollup (active generation, logical columns) or a raw or time-range archive, now or
    --as-of an earlier time.

    With --every, steps: a rollup's buckets merged exactly from their partials (steps that do
    not nest its buckets are refused), or a raw or time-range archive's rows aggregated by
    --agg COLUMN:FUNCTION in --zone (on the driver for small ranges, on Spark for large ones;
    a note on stderr says which). With --realtime, a rollup read that includes the data its
    forward lane has not closed yet.
    """
    from rollup_assets.services.downsample import downsample
    from rollup_assets.services.query import query_arrow
    from rollup_assets.services.realtime import realtime_arrow

    a, b = time_range(start, end)
    for given, name in ((group_by, "--group-by"), (aggs or None, "--agg"), (zone, "--zone")):
        if given is not None and every is None:
            raise click.UsageError(f"{name} needs --every")
    if as_of is not None and (every is not None or realtime):
        raise click.UsageError(
            "--as-of reads stored buckets: it does not combine with --every or --realtime"
        )
    at = parse_instant(as_of, "--as-of") if as_of else None
    ents = list(entities) or None
    if every is not None:
        result = downsample(
            engine(),
            archive,
            every,
            a,
            b,
            ents,
            group_by or "entity",
            realtime,
            aggs=aggs,
            zone=zone,
            spark=spark_session,
        )
        if result.note is not None:
            click.echo(f"note: {result.note}", err=True)
        table = result.table
    elif realtime:
        table = realtime_arrow(engine(), archive, a, b, ents)
    else:
        table = query_arrow(engine(), archive, a, b, ents, as_of=at)
    if limit is not None:
        table = table.slice(0, limit)
    click.echo(render_rows(table, fmt))


def render_rows(table, fmt: str) -> str:
    from rollup_assets.cli.format import render

    return render(rows_of(table), fmt, table.column_names)


@main.command()
@click.option("--entity", "entities", multiple=True, help="Only this entity id (repeatable).")
@tenant_option
@handle_errors
def verify(entities: tuple[str, ...]) -> None:
    """Compare every rollup with a pandas aggregation of its raw or time-range rows (in memory;
    small archives).

    Exits 1 and lists the differences if any level disagrees with the raw data. Buckets reaching
    into raw rows retention removed are not compared (their stored values are the only record);
    their count per rollup is reported.
    """
    from rollup_assets.model.retention import describe_removed
    from rollup_assets.model.specs import RawArchiveSpec, TimeRangeArchiveSpec
    from rollup_assets.services.query import query_arrow
    from rollup_assets.services.verify import compare_all, raw_frame

    ents = list(entities) or None
    problems: list[str] = []
    notes: list[str] = []
    c = catalog()
    bases: list[RawArchiveSpec | TimeRangeArchiveSpec] = [*c.raw.values(), *c.time_range.values()]
    for base in bases:
        names = [r for r in c.rollups if c.base_source(r).name == base.name]
        if not names:
            continue
        raw = raw_frame(
            engine().raw.read_arrow(base, entities=frozenset(ents) if ents else None), base
        )
        removed = engine().removed_spans(base)
        skipped: dict[str, int] = {}
        problems += compare_all(
            lambda name: query_arrow(engine(), name, entities=ents),
            raw,
            c,
            names=names,
            removed=removed,
            skipped=skipped,
        )
        notes += [
            f"{name}: {n} bucket(s) not compared: raw rows of {base.name} removed by retention "
            f"({describe_removed(removed)})"
            for name, n in skipped.items()
            if n
        ]
    for line in [*notes, *problems]:
        click.echo(line)
    if problems:
        raise SystemExit(1)
    click.echo("every level equals a direct aggregation of the raw data")
