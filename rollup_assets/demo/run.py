"""`rollups demo`: the whole product in one run, on the embedded defaults (see `story`)."""

import os
import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import click

from rollup_assets.demo.report import (
    Reader,
    chart,
    epilogue,
    show_before_after,
    show_jobs,
    show_values,
    verify,
)
from rollup_assets.demo.steps import (
    activate_rollups,
    backfill,
    capture,
    ingest_correction,
    ingest_year,
    propagate,
    retention,
)
from rollup_assets.demo.story import MARKER, Story
from rollup_assets.model.errors import DemoError, TenantError
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.settings import Settings

# -- setup ----------------------------------------------------------------------------------------


def prepare_dirs(warehouse: Path, home: Path) -> str:
    """Start clean: remove what an earlier demo wrote; refuse to touch anything else."""
    reused = []
    for path, what in ((warehouse, "warehouse"), (home, "Dagster home")):
        if not path.exists():
            continue
        contents = {p.name for p in path.iterdir()}
        if not contents or contents <= {"dagster.yaml"} or MARKER in contents:
            if MARKER in contents:
                reused.append(what)
            keep_yaml = (path / "dagster.yaml").read_text() if "dagster.yaml" in contents else None
            shutil.rmtree(path)
            if keep_yaml is not None:
                path.mkdir(parents=True)
                (path / "dagster.yaml").write_text(keep_yaml)
            continue
        raise DemoError(
            f"{what} {path} holds data the demo did not write; remove it (`make clean`) or point "
            f"{'ROLLUPS_WAREHOUSE' if path == warehouse else 'DAGSTER_HOME'} somewhere else"
        )
    for path in (warehouse, home):
        path.mkdir(parents=True, exist_ok=True)
        (path / MARKER).write_text("written by `rollups demo`; the next demo run replaces it\n")
    if reused:
        return f"removed the previous demo's {' and '.join(reused)} to start clean"
    return "fresh directories"


def run_demo(settings: Settings, meters: int, days: int, out: Path) -> None:
    from rollup_assets.assembly import build_definitions
    from rollup_assets.demo.delta_spark import read_with_delta_spark
    from rollup_assets.model.spec_loader import load_catalog
    from rollup_assets.orchestration.instance import (
        ensure_home,
        ensure_pools,
        get_instance,
        use_range_event_settings,
    )
    from rollup_assets.orchestration.resources import WarehouseResource
    from rollup_assets.resources.spark import build_session

    warehouse = Warehouse(settings.warehouse)
    home = ensure_home(settings)
    catalog = load_catalog(settings.specs)
    if catalog.tenants:
        raise TenantError(
            f"the demo runs one installation, but {catalog.origin} declares tenants "
            f"({', '.join(catalog.tenants)}); use a spec without tenants"
        )
    click.echo(click.style("rollups demo: rollups that stay correct", bold=True))
    click.echo(f"  warehouse     {warehouse.root}")
    click.echo(f"  Dagster home  {home}")
    click.echo(f"  output        {out}")
    # A local root (a path or a file: URI) is cleaned; an object store is used as it is.
    note = prepare_dirs(Path(warehouse.filesystem()[1]), home) if warehouse.is_local else "as is"
    click.echo(f"  ({note})")
    out.mkdir(parents=True, exist_ok=True)
    resource = WarehouseResource.from_settings(settings, warehouse.root)
    defs = build_definitions(catalog, resource, settings=settings)
    use_range_event_settings(os.environ)  # Dagster reads them when the demo creates a run
    instance = get_instance(settings)  # the home again, after `prepare_dirs` emptied it
    ensure_pools(instance, catalog)
    # The story, not every event of every run (unless ROLLUPS_RUN_LOG_LEVEL says otherwise).
    log_level = settings.run_log_level or "WARNING"
    engine = Engine.from_settings(catalog, warehouse, settings)
    story = Story(catalog, engine, defs, instance, out, meters, days, log_level)
    story.say("starting a local Spark session (one JVM for every run of this demo)", dim=True)
    spark = build_session(
        master=settings.spark_master,
        remote=settings.spark_remote,
        conf={"spark.ui.showConsoleProgress": "false"},
        delta_jars=settings.delta_jars,
        python=settings.pyspark_python,
        java_home=settings.java_home,
    )

    today = datetime.now(UTC).date()
    first = today - timedelta(days=days)
    ingest_year(story, first, today)
    activate_rollups(story)
    backfill(story, first)
    before = show_values(story, first, today)
    corrected_day, late = ingest_correction(story, today)
    snapshot = capture(story, corrected_day)
    reader = Reader(story, corrected_day)
    reader.start()
    jobs = propagate(story)
    reader.stop()
    after = capture(story, corrected_day)
    show_before_after(story, snapshot, after, corrected_day)
    show_jobs(story, jobs)
    reader.report(snapshot, after)
    verify(story)
    read_with_delta_spark(story, spark)
    chart(story, before, corrected_day, late)
    retention(story)
    epilogue(story)
