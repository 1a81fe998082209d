"""Reading archives: query one (now or as of an earlier time, in steps, in real time), and
verify every rollup against its raw data."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    catalog,
    engine,
    handle_errors,
    main,
    selection_options,
    spark_session,
    tenant_option,
    time_range,
)
from rollup_assets.cli.format import rows_of
from rollup_assets.model.windows import parse_instant


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
