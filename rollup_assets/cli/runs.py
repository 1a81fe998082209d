"""Run commands: materialize, tick, recompute and check, executed in this process."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    catalog,
    echo_data,
    engine,
    handle_errors,
    main,
    ops,
    runs_context,
    scope,
    settings,
    tenant,
    tenant_option,
    time_range,
)
from rollup_assets.cli.format import job_row
from rollup_assets.cli.progress import QUIET
from rollup_assets.model.errors import InvalidTimeRangeError
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.windows import Window, iso_utc, parse_instant


@main.command()
@click.argument("rollup")
@click.option("--from", "start", required=True, help="Start of the range (ISO-8601).")
@click.option("--to", "end", required=True, help="End of the range (exclusive).")
@click.option(
    "--downstream",
    is_flag=True,
    help="Bring every level above up to date now, in the same run (without it, the sensors do).",
)
@click.option("--entity", "entities", multiple=True, help="Only this entity id (repeatable).")
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def materialize(
    rollup: str,
    start: str,
    end: str,
    downstream: bool,
    entities: tuple[str, ...],
    fmt: str,
    quiet: bool,
) -> None:
    """Materialize the partitions covering [--from, --to) through Dagster (a Manual recompute).

    On a terminal, a progress line per level counts its partitions done of its total and their
    rate, level by level as the run (and, with --downstream, the chain above) proceeds.
    """
    from rollup_assets.cli.progress import Meter
    from rollup_assets.orchestration.jobs import job_name
    from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
    from rollup_assets.orchestration.runner import execute, tick_until_quiet
    from rollup_assets.orchestration.tags import partition_range_tags

    spec = catalog().rollup(rollup)
    a, b = time_range(start, end)
    assert a is not None and b is not None
    engine().require_activated(spec)
    buckets = buckets_in(spec, [Window(a, b)])
    mark = engine().states.get(rollup).watermark
    closed = [w for w in buckets if mark is not None and w.end <= mark]
    if not closed:
        raise InvalidTimeRangeError(
            f"no partition of '{rollup}' in that range is below its watermark "
            f"({iso_utc(mark) if mark else 'none'}); later buckets belong to the forward lane"
        )
    defs, instance = runs_context()
    keys = key_range_for(partitions_def_for(spec), closed)
    say = click.echo if fmt == "table" else (lambda _text: None)
    say(f"{rollup}: materializing partitions {keys.start} .. {keys.end} ({len(closed)} bucket(s))")
    names = scope()
    # With --downstream the run itself carries the change up the chain (then a tick drains what
    # it could not take); without it the levels above are left to the sensors, as pending work.
    op_config = {"entities": list(entities), "propagate_in_run": downstream}
    config = {"ops": {names.name(rollup): {"config": op_config}}}
    meter = Meter("materialize", unit="partitions", quiet=quiet, line_per_phase=True)
    try:
        run = execute(
            defs,
            instance,
            job_name(spec, names),
            partition_range_tags(keys.start, keys.end),
            config,
            log_level=settings().run_log_level,
            progress=meter,
        )
    finally:
        meter.close()
    assert run is not None
    say(f"  run {run.run_id}: {'success' if run.success else 'FAILED: ' + str(run.error)}")
    runs = [run]
    if run.success and downstream:
        try:
            reports = tick_until_quiet(
                defs,
                instance,
                sensors=("retroactive_write_sensor", "surface_publish_sensor"),
                log_level=settings().run_log_level,
                tenant=names.tenant,
                progress=meter,
            )
        finally:
            meter.close()
        for report in reports:
            for r in report.runs:
                runs.append(r)
                say(
                    f"  {r.tags.get('rollups/rollup')}: run {r.run_id} "
                    f"{'success' if r.success else 'FAILED: ' + str(r.error)}"
                )
    if fmt != "table":
        echo_data(
            [
                {
                    "rollup": r.tags.get("rollups/rollup", rollup),
                    "partitions": f"{r.tags.get('dagster/asset_partition_range_start')}.."
                    f"{r.tags.get('dagster/asset_partition_range_end')}",
                    "ok": r.success,
                    "run_id": r.run_id,
                    "error": r.error,
                }
                for r in runs
            ],
            fmt,
        )
    if not run.success:
        raise SystemExit(1)


@main.command()
@click.option("--now", "now", help="Pin the forward clock (ISO-8601); default: the real time.")
@click.option("--until-quiet", is_flag=True, help="Repeat until a tick launches nothing.")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def tick(now: str | None, until_quiet: bool, fmt: str) -> None:
    """Evaluate the sensors once and execute their run requests in this process."""
    from rollup_assets.orchestration.runner import tick as run_tick
    from rollup_assets.orchestration.runner import tick_until_quiet

    at = parse_instant(now, "--now") if now else None
    name = tenant()
    defs, instance = runs_context()
    level = settings().run_log_level
    reports = (
        tick_until_quiet(defs, instance, at, log_level=level, tenant=name)
        if until_quiet
        else [run_tick(defs, instance, at, log_level=level, tenant=name)]
    )
    rows = [
        {
            "tick": i + 1,
            "rollup": r.tags.get("rollups/rollup"),
            "lane": r.tags.get("rollups/lane"),
            "trigger": r.tags.get("rollups/trigger"),
            "partitions": (
                f"{r.tags.get('dagster/asset_partition_range_start')}.."
                f"{r.tags.get('dagster/asset_partition_range_end')}"
            ),
            "ok": r.success,
            "run_id": r.run_id,
            "error": r.error,
        }
        for i, rep in enumerate(reports)
        for r in rep.runs
    ]
    echo_data(rows, fmt)
    if any(not r["ok"] for r in rows):
        raise SystemExit(1)


@main.command()
@click.argument("rollup")
@click.option("--from", "start", required=True)
@click.option("--to", "end", required=True)
@click.option("--entity", "entities", multiple=True, help="Only this entity id (repeatable).")
@click.option(
    "--no-wait", is_flag=True, help="Only queue the job; the sensor (or `rollups tick`) runs it."
)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def recompute(
    rollup: str, start: str, end: str, entities: tuple[str, ...], no_wait: bool, fmt: str
) -> None:
    """Reader-safe recompute of [--from, --to) (trigger Manual); dependents follow.

    Refused, writing nothing, for a first-level rollup whose raw rows in the range were removed
    by retention; a rollup over a rollup recomputes from the stored level below.
    """
    a, b = time_range(start, end)
    assert a is not None and b is not None
    job = ops().request_recompute(rollup, a, b, frozenset(entities) or None)
    if not no_wait:
        from rollup_assets.orchestration.runner import tick_until_quiet

        defs, instance = runs_context()
        tick_until_quiet(
            defs,
            instance,
            sensors=("retroactive_write_sensor", "surface_publish_sensor"),
            log_level=settings().run_log_level,
            tenant=tenant(),
        )
    final = engine().ledger.job(job.job_id) or job
    if final.coalesced_into:
        final = engine().ledger.job(final.coalesced_into) or final
    echo_data(job_row(final, catalog().rollup(rollup)), fmt)


@main.command()
@click.argument("rollup")
@click.option(
    "--from", "start", required=True, help="Check the partitions covering [--from, --to)."
)
@click.option("--to", "end", required=True)
@click.option("--max-partitions", type=int, default=50, show_default=True)
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def check(rollup: str, start: str, end: str, max_partitions: int, fmt: str) -> None:
    """Run the `matches_source` asset check, one partition per run (per partition in the UI)."""
    from rollup_assets.orchestration.checks import check_job_name
    from rollup_assets.orchestration.partitions import partitions_def_for
    from rollup_assets.orchestration.runner import check_evaluations, execute

    spec = catalog().rollup(rollup)
    a, b = time_range(start, end)
    assert a is not None and b is not None
    mark = engine().require_activated(spec).watermark
    buckets = [w for w in buckets_in(spec, [Window(a, b)]) if mark is not None and w.end <= mark]
    if not buckets:
        raise InvalidTimeRangeError(f"no aggregated (closed) partition of '{rollup}' in that range")
    if len(buckets) > max_partitions:
        raise InvalidTimeRangeError(
            f"{len(buckets)} partitions in range; narrow it or raise --max-partitions"
        )
    defs, instance = runs_context()
    pdef = partitions_def_for(spec)
    rows = []
    for w in buckets:
        key = pdef.get_partition_key_for_timestamp(w.start.timestamp())
        run = execute(
            defs,
            instance,
            check_job_name(spec, scope()),
            {"dagster/partition": key},
            log_level=settings().run_log_level,
        )
        assert run is not None
        results = check_evaluations(instance, run.run_id)
        passed = run.success and bool(results) and all(r["passed"] for r in results)
        differing = sum(int(r["metadata"].get("differing_rows", 0)) for r in results)
        rows.append(
            {
                "partition": key,
                "passed": passed,
                "differing_rows": differing,
                "run_id": run.run_id,
                "error": run.error,
            }
        )
    echo_data(rows, fmt)
    if not all(r["passed"] for r in rows):
        raise SystemExit(1)
