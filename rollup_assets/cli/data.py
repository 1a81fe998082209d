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
    """Load and validate the spec file; list the archives it declares."""
    from rollup_assets.model.describe import describe

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
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def ingest(archive: str, file: str, change_source: str, fmt: str, quiet: bool) -> None:
    """Upsert a Parquet or CSV FILE into a raw or time-range ARCHIVE (all or nothing). On a
    terminal, a progress line counts the rows validated, then upserted, and their rate."""
    from rollup_assets.cli.progress import Meter
    from rollup_assets.model.jobs import ChangeSource
    from rollup_assets.services.ingest import ingest_file

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
    fmt: str,
    limit: int | None,
    as_of: str | None,
) -> None:
    """Read a rollup (active generation, logical columns) or a raw archive, now or --as-of an
    earlier time."""
    from rollup_assets.services.query import query_arrow

    a, b = time_range(start, end)
    at = parse_instant(as_of, "--as-of") if as_of else None
    table = query_arrow(engine(), archive, a, b, list(entities) or None, as_of=at)
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
