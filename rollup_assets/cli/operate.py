"""Operator commands: freeze, rewind, lifecycle, history, health, maintenance, surfaces, setup,
demo."""

from dataclasses import asdict
from datetime import UTC, datetime

import click

from rollup_assets.cli.app import (
    FORMATS,
    catalog,
    echo_data,
    engine,
    handle_errors,
    main,
    ops,
    settings,
    tenant_option,
)
from rollup_assets.cli.format import (
    LINEAGE_COLUMNS,
    held_row,
    job_row,
    lineage_rows,
    state_row,
)
from rollup_assets.model.windows import iso_utc, parse_instant


@main.command()
@click.argument("rollup")
@click.option(
    "--until", required=True, help="Buckets ending at or before this instant are not written."
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def freeze(rollup: str, until: str, fmt: str) -> None:
    """Freeze a rollup up to --until (monotonic: a smaller value is rejected)."""
    echo_data(state_row(ops().freeze(rollup, parse_instant(until, "--until"))), fmt)


@main.command()
@click.argument("rollup")
@click.option(
    "--accept-gaps",
    is_flag=True,
    help="Recorded for audit (in the archive state and its history): the operator accepts "
    "that the frozen range may have gaps. It changes nothing else: held writes are applied "
    "either way.",
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def unfreeze(rollup: str, accept_gaps: bool, fmt: str) -> None:
    """Lift a freeze; the held writes (see `rollups held`) and the other pending work in the
    frozen range drain on the next tick, and the chain carries them up."""
    echo_data(state_row(ops().unfreeze(rollup, accept_gaps)), fmt)


@main.command()
@click.argument("rollup")
@click.option("--to", "to", required=True, help="Bucket boundary to move the watermark back to.")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def rewind(rollup: str, to: str, fmt: str) -> None:
    """DESTRUCTIVE: move the watermark back; the forward lane re-aggregates from there, and until
    it has, readers see the older generation-0 rows of that range."""
    state, deleted = ops().rewind(rollup, parse_instant(to, "--to"))
    echo_data({**state_row(state), "recomputed_rows_dropped": deleted}, fmt)


@main.command()
@click.argument("rollup")
@click.option("--job", "job_id", required=True, help="Id of the recompute job to undo.")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def rollback(rollup: str, job_id: str, fmt: str) -> None:
    """Undo recompute job --job: its cells get back the generation it replaced, in one pointer
    commit, recorded as a Rollback job; the levels above are queued for recompute (the sensors
    run them, as after any change).

    Refused, changing nothing: an unknown job, a job that flipped nothing, a flip older than the
    generation retention (ROLLUPS_GENERATION_RETENTION_HOURS, default 168) or whose replaced rows
    were swept, cells a later job changed again (roll that one back first), a recompute of the
    rollup in flight, or a freeze over the job's buckets.
    """
    out = ops().rollback(rollup, job_id)
    echo_data(
        {
            "rollup": rollup,
            "rollback_job": out.job.job_id,
            "undid": job_id,
            "buckets": len(out.cells),
            "restored_generations": ", ".join(str(g) for g in out.generations) or "0",
            "genmap_version": out.version,
            "queued_above": ", ".join(f"{j.rollup}:{j.job_id}" for j in out.propagated) or None,
        },
        fmt,
    )


def _lifecycle(action: str, doc: str) -> None:
    @main.command(name=action, help=doc)
    @click.argument("archive")
    @click.option("--format", "fmt", type=FORMATS, default="table")
    @tenant_option
    @handle_errors
    def _cmd(archive: str, fmt: str) -> None:
        echo_data(state_row(getattr(ops(), action)(archive)), fmt)


_lifecycle("activate", "Activate ARCHIVE (provisions tables; a rollup starts one bucket back).")
_lifecycle(
    "disable",
    "Disable ARCHIVE (data kept; a running recompute stops and is queued again; pending work "
    "waits until the archive is enabled).",
)
_lifecycle("enable", "Re-activate a disabled or failed ARCHIVE; new pending work drains again.")
_lifecycle("delete", "Delete ARCHIVE and its data (rejected while activated rollups read from it).")


# -- history and health -------------------------------------------------------------------------


@main.command()
@click.argument("rollup")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option(
    "--lane",
    type=click.Choice(["recompute", "forward", "all"]),
    default="recompute",
    show_default=True,
    help="recompute: the job history (manual, late-write and chain recomputes); forward: the "
    "forward lane's closes and open-bucket refreshes; all: both.",
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def jobs(rollup: str, limit: int, lane: str, fmt: str) -> None:
    """Job history of ROLLUP, newest first: its recompute jobs, unless --lane says otherwise."""
    from rollup_assets.model.jobs import Lane

    spec = catalog().rollup(rollup)
    only = None if lane == "all" else Lane(lane)
    echo_data([job_row(j, spec) for j in engine().ledger.history(rollup, limit, only)], fmt)


@main.command()
@click.argument("rollup")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def held(rollup: str, fmt: str) -> None:
    """Writes into ROLLUP's frozen range, held until the unfreeze, oldest first: the source
    commit (archive and table version), its changed rows in the held cells, the time range and
    the buckets and cells it holds."""
    from rollup_assets.services.held import held_writes

    echo_data([held_row(h) for h in held_writes(engine(), rollup)], fmt)


@main.command()
@click.argument("rollup")
@click.option(
    "--bucket",
    required=True,
    help="An instant in the bucket (its start, or any time inside it; ISO-8601, naive = UTC).",
)
@click.option("--entity", required=True, help="The entity id of the row.")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def lineage(rollup: str, bucket: str, entity: str, fmt: str) -> None:
    """What ROLLUP's active row of --entity in the bucket of --bucket reflects: the job, Dagster
    run, generation and source versions behind it, the rows of each level below as they were
    read, down to the raw commits (version, time, operation, change source, rows of the cell,
    file) up to the version each first-level row read. Level 0 is the row asked about."""
    from rollup_assets.services.lineage import lineage as trace

    root = trace(engine(), rollup, parse_instant(bucket, "--bucket"), entity)
    echo_data(lineage_rows(root), fmt, None if fmt == "json" else LINEAGE_COLUMNS)


@main.command()
@click.argument("rollup", required=False)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def status(rollup: str | None, fmt: str) -> None:
    """Health of one rollup or of every archive: status, watermark, pending and held work, the
    last success and failure, work given up after its last attempt, any action (a rewind, a
    column change) under way or left unfinished, the instant retention keeps rows from (raw and
    rollups), and how many seconds its surface table lags behind its oldest change not
    published yet (0: none)."""
    from rollup_assets.model.intents import Intent
    from rollup_assets.services.health import health
    from rollup_assets.services.surface_lag import surface_lag

    names = [catalog().rollup(rollup).name] if rollup else list(catalog().rollups)
    snap, states = engine().ledger.snapshot(), engine().states.all()
    now = datetime.now(UTC)
    rows = []
    for n in names:
        fields = health(catalog(), n, snap, states)
        h = asdict(fields)
        # How far plain readers of the surface are behind (None: unknown, or nothing yet).
        lag = surface_lag(engine(), catalog().rollup(n)) if n in states else None
        seconds = None if lag is None else lag.seconds(now)
        h["surface_lag_s"] = None if seconds is None else round(seconds, 1)
        # The ranges as text (`asdict` turned each window into a dict).
        h["pending_recompute_ranges"] = (
            ", ".join(str(w) for w in fields.pending_recompute_ranges) or None
        )
        h["held_ranges"] = ", ".join(str(w) for w in fields.held_ranges) or None
        rows.append(
            {k: iso_utc(v) if hasattr(v, "tzinfo") and v is not None else v for k, v in h.items()}
        )
    if not rollup:
        for n in [*catalog().raw, *catalog().time_range]:
            s = states.get(n)
            intent = Intent.decode(s.intent) if s else None
            rows.insert(
                0,
                {
                    "archive": n,
                    "status": s.status.value if s else "Created",
                    "action_under_way": intent.describe() if intent else None,
                    "retained_from": iso_utc(s.retained_from) if s and s.retained_from else None,
                },
            )
    echo_data(rows, fmt)


@main.command()
@click.option(
    "--now",
    "now",
    help="Measure the retention horizons from this instant (ISO-8601); "
    "default: ROLLUPS_NOW, else the real time.",
)
@click.option(
    "--retention-hours",
    type=int,
    default=168,
    show_default=True,
    help="Vacuum deletes files unreferenced for longer than this (keep it above the longest "
    "read or run; never less than ROLLUPS_GENERATION_RETENTION_HOURS); unrelated to an "
    "archive's raw retention.",
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def maintain(now: str | None, retention_hours: int, fmt: str) -> None:
    """Finish interrupted actions, apply raw and rollup retention, then sweep, compact, vacuum
    and checkpoint every table.

    Retention: an activated raw or time-range archive whose spec declares `retention` loses its
    UTC days older than now - retention, once every first-level rollup reading it has
    aggregated them. The rollups keep their values (a retention delete is not a correction).
    A rollup declaring `retention` loses its buckets older than now - retention, once every
    rollup reading it has aggregated them; the levels above keep their values.
    Actions an interrupted process left half done (a rewind, a column change, a rollback) are
    finished first. Each table's compaction, vacuum and checkpoint runs on its own, retried
    when it loses a commit race; exits 1 if an archive's retention or a step of a table failed
    (the others are still applied, and each failure is printed).
    """
    from rollup_assets.services.maintenance import maintain as run

    at = parse_instant(now, "--now") if now else settings().now
    report = run(engine(), now=at, retention_hours=retention_hours)
    shown = {"details", "retention", "rollup_retention", "failures"}
    echo_data({k: v for k, v in asdict(report).items() if k not in shown}, fmt)
    lines = [o.describe() for o in report.retention]
    lines += [o.describe() for o in report.rollup_retention]
    for line in lines:
        click.echo(line, err=fmt != "table")
    for failure in report.failures:
        click.echo(f"failed: {failure}", err=True)
    if report.retention_failures or report.failures:
        raise SystemExit(1)


@main.command()
@click.argument("rollups", nargs=-1)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def publish(rollups: tuple[str, ...], fmt: str) -> None:
    """Bring each ROLLUP's surface table (default: every activated rollup's) up to date.

    The surface, `rollups/<rollup>__active` under the warehouse, holds exactly the active rows
    (the logical columns of `query`) for tools that read Delta tables directly. The surface
    publish sensor keeps it within ROLLUPS_SURFACE_MAX_LAG_SECONDS of the last flip, and
    maintenance and checks publish it too; this publishes one on demand.
    """
    from rollup_assets.services.surface import publish as publish_one
    from rollup_assets.services.surface import publish_all

    if rollups:
        done = [publish_one(engine(), catalog().rollup(name)) for name in rollups]
    else:
        done = publish_all(engine())
    echo_data(
        [
            {
                "rollup": p.rollup,
                "surface": engine().warehouse.surface_path(p.rollup),
                "action": "rebuilt"
                if p.rebuilt
                else (f"updated {p.spans} span(s)" if p.spans else "up to date"),
                "rows_written": p.rows_written,
                "files_replaced": p.files_removed,
                "pointer_version": p.reflects.genmap,
                "rows_version": p.reflects.rows,
                "surface_version": p.surface_version,
            }
            for p in done
        ],
        fmt,
    )


@main.command()
@handle_errors
def setup() -> None:
    """Create DAGSTER_HOME (default ./.dagster_home) and give every rollup pool (every tenant's,
    when the spec declares tenants) a limit of 1."""
    from rollup_assets.orchestration.instance import ensure_pools, get_instance, pool_names

    instance = get_instance(settings())
    ensure_pools(instance, catalog())
    click.echo(
        f"DAGSTER_HOME={instance.root_directory}; pools: "
        + ", ".join(f"{n}=1" for n in pool_names(catalog()))
    )


@main.command()
@click.option("--meters", type=click.IntRange(1, 1000), default=36, show_default=True)
@click.option("--days", type=click.IntRange(120, 730), default=365, show_default=True)
@click.option(
    "--out",
    type=click.Path(file_okay=False),
    default="demo_output",
    show_default=True,
    help="Where the landing files and the chart go.",
)
@handle_errors
def demo(meters: int, days: int, out: str) -> None:
    """The end-to-end story: ingest a year, backfill, correct, propagate, verify, chart.

    Uses ROLLUPS_WAREHOUSE and DAGSTER_HOME (defaults ./warehouse, ./.dagster_home) and replaces
    what an earlier demo wrote there; it refuses to touch directories it did not write.
    """
    from pathlib import Path

    from rollup_assets.demo.run import run_demo

    run_demo(settings(), meters, days, Path(out).resolve())
