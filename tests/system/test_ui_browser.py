"""The Dagster UI in a real browser: `dagster dev` on a free port, driven by headless Chromium.

A temporary Dagster home and warehouse get a few days of materialized rollups first (the sensors'
own runs, recorded in that home's storage), then the test checks what a user would look at: the
asset graph draws every declared archive and rollup, a rollup's partitions page counts the
materialized partitions the instance recorded and shows one with its metadata, and both sensors
are running and ticking. Then it works the way an operator does: it launches the operator job
`recompute_rollup` from the launchpad (its config typed into the editor) and a backfill of a few
missing partitions from an asset's materialize dialog, follows both in the UI until they
succeed, and checks their outcome in the ledger and the warehouse against the pandas oracle.
Screenshots of each step land in test-artifacts/ui/; set ROLLUPS_UPDATE_DOCS_SCREENSHOT=1 to
also refresh docs/images/ui-asset-graph.png.

The last test shows that the graph check can fail: with a rollup removed from the spec file, the
same check reports that rollup missing.
"""

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path

import dagster as dg
import pandas as pd
import pyarrow as pa
import pytest
import yaml
from dagster._core.execution.backfill import BulkActionStatus
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.describe import group_name
from rollup_assets.model.jobs import Job, JobState, Trigger
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import Catalog, RawArchiveSpec
from rollup_assets.model.windows import Window, iso_utc
from rollup_assets.orchestration.instance import EVENT_BATCH_SIZE, dagster_yaml, ensure_pools
from rollup_assets.orchestration.partitions import partitions_def_for
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import DEFAULT_SPECS, Settings
from tests.conftest import World, days
from tests.oracle import compare, oracle, raw_frame
from tests.system.daemon import wait_for as poll
from tests.system.ui import (
    DagsterDev,
    chromium,
    dagster_dev,
    drawn_graph_nodes,
    graph_node_xpath,
    screenshot,
    screenshot_on_failure,
    start_dagster_dev,
    wait_for,
    wait_for_graph_nodes,
    wait_until,
    wait_until_still,
    xpath_literal,
)

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts" / "ui"
DOCS_SCREENSHOT = REPO / "docs" / "images" / "ui-asset-graph.png"
LOCATION = yaml.safe_load((REPO / "workspace.yaml").read_text())["load_from"][0]["python_module"][
    "location_name"
]
SENSORS = ("retroactive_write_sensor", "forward_aggregation_sensor", "surface_publish_sensor")
ENERGY_CHAIN = {"energy_raw", "energy_hourly", "energy_daily", "energy_weekly", "energy_monthly"}
# The rollups are activated at ACTIVATED and the forward lane closes buckets up to NOW. The
# server's sensors see the same pinned clock (ROLLUPS_NOW), so they find nothing left to close and
# launch no Spark runs while the browser looks around.
ACTIVATED = datetime(2025, 3, 1, tzinfo=UTC)
NOW = datetime(2025, 3, 7, 12, tzinfo=UTC)
METERS = 3
TIMEOUT_S = 90  # per page element: the 2-core CI machine is shared
RUN_TIMEOUT_S = 420  # a run the daemon launches starts its own Spark on that machine
# What the operator asks for: a recompute of one Vienna day of energy_daily (its bucket in
# UTC), and a backfill of three hours of energy_hourly on the day before the activation, which
# the forward lane never reached (missing partitions whose raw rows are there).
RECOMPUTE_DAY = Window(datetime(2025, 3, 2, 23, tzinfo=UTC), datetime(2025, 3, 3, 23, tzinfo=UTC))
BACKFILL = ("2025-02-28-06:00", "2025-02-28-08:00")
EDITOR = "document.querySelector('.CodeMirror').CodeMirror"
DIALOG = "//*[@role='dialog']"


@dataclass
class Demo:
    home: Path
    warehouse: Path
    catalog: Catalog
    daily_materialized: list[str]  # partition keys of energy_daily, as the instance recorded them


def write_home(home: Path) -> Path:
    """A persistent Dagster home, as `rollups setup` writes it."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "dagster.yaml").write_text(dagster_yaml({}, home))
    return home


def server_env(home: Path, warehouse: Path) -> dict[str, str]:
    return {
        **os.environ,
        "DAGSTER_HOME": str(home),
        "ROLLUPS_WAREHOUSE": str(warehouse),
        "DAGSTER_EMIT_PARTITION_SUBSET_IN_PLANNED_EVENTS": "1",
        "DAGSTER_EVENT_BATCH_SIZE": str(EVENT_BATCH_SIZE),
        "ROLLUPS_NOW": iso_utc(NOW),
    }


def assets_of(catalog: Catalog) -> list[str]:
    return sorted([*catalog.raw, *catalog.time_range, *catalog.rollups])


@pytest.fixture(scope="module", autouse=True)
def fresh_artifacts() -> None:
    """No screenshot or log from an earlier run survives to be mistaken for this run's."""
    shutil.rmtree(ARTIFACTS, ignore_errors=True)
    ARTIFACTS.mkdir(parents=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    with chromium() as driver:
        yield driver


@dataclass
class Undeclared:
    server: DagsterDev
    declared: list[str]  # what the reduced spec file declares
    removed: str


@pytest.fixture(scope="module")
def without_yearly(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Undeclared]:
    """`dagster dev` on an empty home whose spec file lacks energy_yearly (the negative case)."""
    root = tmp_path_factory.mktemp("ui-without-yearly")
    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    del doc["rollups"]["energy_yearly"]
    specs = root / "rollups.yaml"
    specs.write_text(yaml.safe_dump(doc, sort_keys=False))
    env = server_env(write_home(root / "dagster_home"), root / "warehouse")
    env["ROLLUPS_SPECS"] = str(specs)
    server = start_dagster_dev(REPO, env, ARTIFACTS / "dagster-dev-without-yearly.log")
    try:
        yield Undeclared(server, assets_of(load_catalog(specs)), "energy_yearly")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory, spark, without_yearly: Undeclared) -> Demo:
    """A few days of readings for a few meters, every level materialized by the sensors' runs
    in a real (file-backed) instance, so that a webserver on the same home sees the history.

    The negative case's server (its own home and warehouse) boots meanwhile."""
    root = tmp_path_factory.mktemp("ui-demo")
    home, wh = write_home(root / "dagster_home"), root / "warehouse"
    catalog = load_catalog()
    assert set(assets_of(catalog)) >= ENERGY_CHAIN | {"energy_yearly"}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DAGSTER_HOME", str(home))
        mp.setenv("ROLLUPS_WAREHOUSE", str(wh))
        defs = build_definitions(
            catalog, WarehouseResource(root=str(wh)), settings=Settings.from_env()
        )
        with dg.DagsterInstance.from_config(str(home)) as instance:
            ensure_pools(instance, catalog)
            world = World(root, catalog, Engine(catalog, Warehouse(str(wh))), defs, instance)
            world.ops.activate("energy_raw", now=ACTIVATED)
            readings = [day_batch(d, METERS) for d in days(date(2025, 2, 28), 8)]
            world.ingest(pa.concat_tables(readings), source="Import")
            world.activate_all(ACTIVATED)
            world.tick(NOW)
            materialized = {
                name: sorted(instance.get_materialized_partitions(dg.AssetKey(name)))
                for name in catalog.rollups
            }
    assert all(materialized.values()), materialized
    return Demo(home, wh, catalog, materialized["energy_daily"])


@pytest.fixture(scope="module")
def ui(demo: Demo) -> Iterator[DagsterDev]:
    env = server_env(demo.home, demo.warehouse)
    with dagster_dev(REPO, env, ARTIFACTS / "dagster-dev.log") as server:
        yield server


def test_asset_graph_shows_every_rollup(ui: DagsterDev, browser: WebDriver, demo: Demo) -> None:
    expected = assets_of(demo.catalog)
    with screenshot_on_failure(browser, ARTIFACTS / "failed-asset-graph.png"):
        browser.get(f"{ui.url}/asset-groups")
        wait_for_graph_nodes(browser, expected, TIMEOUT_S)
        screenshot(browser, ARTIFACTS / "lineage.png")

        # The chain's own group, with the side navigation folded away: the README picture.
        hide = "//*[normalize-space(text())='Hide navigation']"
        wait_for(browser, hide, TIMEOUT_S, "'Hide navigation' control").click()
        group = group_name(demo.catalog, "energy_daily")
        browser.get(f"{ui.url}/locations/{LOCATION}/asset-groups/{group}/lineage")
        chain = sorted(a for a in expected if group_name(demo.catalog, a) == group)
        assert set(chain) >= ENERGY_CHAIN
        wait_for_graph_nodes(browser, chain, TIMEOUT_S)
        # Full nodes carry live partition health ("n% filled"); wait for all of them to load.
        filled = "//*[local-name()='foreignObject']//*[contains(text(), '% filled')]"
        wait_for(browser, f"({filled})[{len(chain)}]", TIMEOUT_S, "partition health on each node")
        wait_until_still(browser, graph_node_xpath("energy_daily"), TIMEOUT_S)
        shot = screenshot(browser, ARTIFACTS / "asset-graph.png")
    if os.environ.get("ROLLUPS_UPDATE_DOCS_SCREENSHOT") == "1":
        DOCS_SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_SCREENSHOT)


def test_partitions_page_shows_materialized_partitions(
    ui: DagsterDev, browser: WebDriver, demo: Demo
) -> None:
    """The count the page shows is the instance's own record, and a materialized partition
    shows its status tag and what wrote it; the run's last partition, the run's figures too."""
    count = len(demo.daily_materialized)
    key = demo.daily_materialized[len(demo.daily_materialized) // 2]
    with screenshot_on_failure(browser, ARTIFACTS / "failed-partitions.png"):
        browser.get(f"{ui.url}/assets/energy_daily?view=partitions&partition={key}")
        label = f"Materialized ({count:,})"
        try:
            wait_for(browser, f"//label[normalize-space()='{label}']", TIMEOUT_S, label)
        except AssertionError:
            shown = browser.find_elements(By.XPATH, "//label[contains(., 'Materialized')]")
            raise AssertionError(f"expected {label!r}; shown: {[e.text for e in shown]}") from None
        header = (
            f"//*[span//div[@title={xpath_literal(key)}]"
            " and div/span[@data-tooltip='Materialized']]"
        )
        wait_for(browser, header, TIMEOUT_S, f"'Materialized' tag on partition {key}")
        for field in ("generation", "trigger", "job_id", "source_versions", "table_version"):
            wait_for(browser, f"//table//span[normalize-space()='{field}']", TIMEOUT_S, field)
        screenshot(browser, ARTIFACTS / "partitions.png")
        # One run wrote every partition; its last says the run's own figures (rows, Spark).
        last = demo.daily_materialized[-1]
        browser.get(f"{ui.url}/assets/energy_daily?view=partitions&partition={last}")
        for field in ("generation", "rows", "spark"):
            wait_for(browser, f"//table//span[normalize-space()='{field}']", TIMEOUT_S, field)


def test_sensors_are_running(ui: DagsterDev, browser: WebDriver) -> None:
    """Each sensor's switch is on and the daemon has evaluated it at least once."""
    switch = "//tr[td[normalize-space()='Running']]//input[@type='checkbox']"
    tick = "//tr[td[normalize-space()='Latest tick']]/td[2]//div[@title]"
    for name in SENSORS:
        with screenshot_on_failure(browser, ARTIFACTS / f"failed-{name}.png"):
            browser.get(f"{ui.url}/locations/{LOCATION}/sensors/{name}")
            wait_until(
                browser,
                lambda d: any(e.is_selected() for e in d.find_elements(By.XPATH, switch)),
                TIMEOUT_S,
                f"{name} switched on",
            )
            wait_for(browser, tick, TIMEOUT_S, f"tick of {name}")
            screenshot(browser, ARTIFACTS / f"sensor-{name}.png")
    with screenshot_on_failure(browser, ARTIFACTS / "failed-sensors.png"):
        browser.get(f"{ui.url}/automation")
        for name in SENSORS:
            # The row's selection box is never ticked here, so a selected box is the switch.
            row = f"//*[@data-index][.//a[@href='/locations/{LOCATION}/sensors/{name}']]"
            wait_until(
                browser,
                lambda d, row=row: any(
                    e.is_selected() for e in d.find_elements(By.XPATH, f"{row}//input")
                ),
                TIMEOUT_S,
                f"{name} switched on in the automation list",
            )
        screenshot(browser, ARTIFACTS / "sensors.png")


def editor_text(driver: WebDriver) -> str:
    return driver.execute_script(f"return {EDITOR}.getValue()")


def run_page(driver: WebDriver) -> str | None:
    """The id of the run whose page the browser shows (None: not on a run's page)."""
    found = re.search(r"/runs/([0-9a-f-]{36})", driver.current_url)
    return found.group(1) if found else None


def oracle_problems(demo: Demo, rollup: str, windows: list[Window]) -> list[str]:
    """How the stored buckets `windows` of `rollup` differ from the pandas aggregation of the
    raw rows (empty: equal); the oracle must have rows there, or the comparison proves nothing."""
    engine = Engine(demo.catalog, Warehouse(str(demo.warehouse)))
    spec = demo.catalog.rollup(rollup)
    raw_spec = demo.catalog.archive("energy_raw")
    assert isinstance(raw_spec, RawArchiveSpec)
    expected = oracle(raw_frame(engine.raw.read_arrow(raw_spec), raw_spec), spec)
    starts = [pd.Timestamp(w.start) for w in windows]
    expected = expected[expected["bucket_start"].isin(starts)]
    assert len(expected) == len(windows) * METERS, expected
    actual = query_arrow(engine, rollup, windows[0].start, windows[-1].end)
    return compare(actual, expected, spec)


@pytest.fixture(scope="module")
def launched() -> dict[str, str]:
    """What the launchpad test launched (the ledger job its run queued), for the test that
    waits for the sensor to carry it out."""
    return {}


def test_operator_job_from_the_launchpad(
    ui: DagsterDev, browser: WebDriver, demo: Demo, launched: dict[str, str]
) -> None:
    """`recompute_rollup` from the launchpad: its config typed into the editor, the run followed
    to success on its page, and the job it reports queued found in the ledger as asked."""
    engine = Engine(demo.catalog, Warehouse(str(demo.warehouse)))
    with screenshot_on_failure(browser, ARTIFACTS / "failed-launchpad.png"):
        browser.get(f"{ui.url}/locations/{LOCATION}/jobs/recompute_rollup/playground")
        wait_for(browser, "//*[contains(@class, 'CodeMirror')]", TIMEOUT_S, "the config editor")
        # The launchpad starts from the job's default config (the warehouse resource's root).
        wait_until(browser, lambda d: "warehouse" in editor_text(d), TIMEOUT_S, "default config")
        config = yaml.safe_load(editor_text(browser)) or {}
        op_config = {
            "rollup": "energy_daily",
            "start": RECOMPUTE_DAY.start.isoformat(),
            "end": RECOMPUTE_DAY.end.isoformat(),
            "entities": [],
        }
        config["ops"] = {"queue_recompute": {"config": op_config}}
        browser.execute_script(f"{EDITOR}.setValue(arguments[0])", yaml.safe_dump(config))
        assert yaml.safe_load(editor_text(browser)) == config
        # The launchpad validates the config against the job's schema as it changes.
        wait_for(browser, "//*[normalize-space(text())='No errors']", TIMEOUT_S, "a valid config")
        launch = wait_for(browser, "//button[normalize-space()='Launch Run']", TIMEOUT_S, "Launch")
        wait_until(browser, lambda d: launch.is_enabled(), TIMEOUT_S, "an enabled Launch Run")
        screenshot(browser, ARTIFACTS / "launchpad-config.png")
        launch.click()

        run_id = wait_until(browser, run_page, TIMEOUT_S, "the launched run's page")
        success = "//*[contains(@class, 'BaseTag')][normalize-space()='Success']"
        wait_for(browser, success, RUN_TIMEOUT_S, "the run's Success status")
        said = wait_for(
            browser,
            "//*[starts-with(normalize-space(text()), 'queued manual recompute ')]",
            TIMEOUT_S,
            "the run's log line naming the job it queued",
        )
        screenshot(browser, ARTIFACTS / "launchpad-run.png")
    job_id = said.text.split()[3]
    job = engine.ledger.job(job_id)
    assert job is not None, f"run {run_id} reported job {job_id}, which the ledger lacks"
    assert (job.rollup, job.trigger, job.windows) == (
        "energy_daily",
        Trigger.MANUAL,
        (RECOMPUTE_DAY,),
    )
    launched["job_id"] = job_id


def test_backfill_from_the_materialize_dialog(
    ui: DagsterDev, browser: WebDriver, demo: Demo
) -> None:
    """A backfill of three missing partitions chosen in an asset's materialize dialog: followed
    on its page until it succeeds; its one run materialized exactly those partitions, and
    their values equal the oracle's."""
    spec = demo.catalog.rollup("energy_hourly")
    pdef = partitions_def_for(spec)
    keys = pdef.get_partition_keys_in_range(dg.PartitionKeyRange(*BACKFILL))
    windows = [
        Window(tw.start.astimezone(UTC), tw.end.astimezone(UTC))
        for tw in (pdef.time_window_for_partition_key(k) for k in keys)
    ]
    assert len(keys) == 3
    asset = dg.AssetKey("energy_hourly")
    with dg.DagsterInstance.from_config(str(demo.home)) as instance:
        assert not set(keys) & instance.get_materialized_partitions(asset)
        earlier = {b.backfill_id for b in instance.get_backfills()}

        with screenshot_on_failure(browser, ARTIFACTS / "failed-backfill.png"):
            browser.get(f"{ui.url}/assets/energy_hourly?view=partitions")
            wait_for(
                browser, "//button[normalize-space()='Materialize…']", TIMEOUT_S, "Materialize…"
            ).click()
            # The dialog offers the last 90 days at first; these partitions are older.
            show_all = f"{DIALOG}//*[normalize-space()='Show all partitions' and not(*)]"
            wait_for(browser, show_all, TIMEOUT_S, "'Show all partitions'").click()
            field = wait_for(
                browser,
                f"{DIALOG}//input[starts-with(@placeholder, 'ex: ')]",
                TIMEOUT_S,
                "the dialog's partition selection",
            )
            field.send_keys(f"[{BACKFILL[0]}...{BACKFILL[1]}]", Keys.TAB)
            count = f"{DIALOG}//*[normalize-space(text())='{len(keys)} partitions']"
            wait_for(browser, count, TIMEOUT_S, f"{len(keys)} partitions selected")
            screenshot(browser, ARTIFACTS / "backfill-dialog.png")
            wait_for(
                browser,
                f"{DIALOG}//button[normalize-space()='Launch backfill']",
                TIMEOUT_S,
                "Launch",
            ).click()

            def created() -> str | None:
                new = [
                    b.backfill_id for b in instance.get_backfills() if b.backfill_id not in earlier
                ]
                return new[0] if new else None

            backfill_id = wait_until(browser, lambda d: created(), TIMEOUT_S, "a new backfill")
            browser.get(f"{ui.url}/runs/b/{backfill_id}")
            # The backfill's status tag (the page refreshes itself): "In progress" until done.
            done = (
                "//*[contains(@class, 'BaseTag')]"
                "[normalize-space()='Succeeded' or normalize-space()='Completed']"
            )
            wait_for(browser, done, RUN_TIMEOUT_S, f"backfill {backfill_id} succeeded")
            screenshot(browser, ARTIFACTS / "backfill-done.png")

            key = keys[1]
            browser.get(f"{ui.url}/assets/energy_hourly?view=partitions&partition={key}")
            header = (
                f"//*[span//div[@title={xpath_literal(key)}]"
                " and div/span[@data-tooltip='Materialized']]"
            )
            wait_for(browser, header, TIMEOUT_S, f"'Materialized' tag on partition {key}")
            screenshot(browser, ARTIFACTS / "backfill-partition.png")

        backfill = instance.get_backfill(backfill_id)
        assert backfill is not None and backfill.status is BulkActionStatus.COMPLETED_SUCCESS
        runs = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS]  # single_run policy
        events = instance.all_logs(
            runs[0].run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
        )
        written = {
            e.asset_materialization.partition
            for e in events
            if e.asset_materialization and e.asset_materialization.asset_key == asset
        }
        assert written == set(keys)
        assert set(keys) <= instance.get_materialized_partitions(asset)
    assert oracle_problems(demo, "energy_hourly", windows) == []


def test_the_queued_recompute_is_carried_out(demo: Demo, launched: dict[str, str]) -> None:
    """The retroactive-write sensor runs the job the launchpad queued (alongside the backfill),
    and the day it recomputed equals the oracle."""
    if "job_id" not in launched:
        pytest.fail("the launchpad test queued no job (see its failure)")
    engine = Engine(demo.catalog, Warehouse(str(demo.warehouse)))

    def finished() -> Job | None:
        job = engine.ledger.job(launched["job_id"])
        while job is not None and job.coalesced_into:
            job = engine.ledger.job(job.coalesced_into)
        return job if job is not None and job.state.terminal else None

    job = poll(finished, RUN_TIMEOUT_S, what=f"job {launched['job_id']} to finish")
    assert job.state is JobState.COMPLETED, job
    assert job.run_id is not None
    assert oracle_problems(demo, "energy_daily", [RECOMPUTE_DAY]) == []


def test_graph_check_fails_for_an_undeclared_rollup(
    without_yearly: Undeclared, browser: WebDriver
) -> None:
    """The graph check is not vacuous: a code location whose spec file lacks energy_yearly
    draws the rest of the chain, no energy_yearly, and the same check reports it missing."""
    server, declared, removed = (
        without_yearly.server,
        without_yearly.declared,
        without_yearly.removed,
    )
    everything = sorted([*declared, removed])
    server.wait_ready(120)
    with screenshot_on_failure(browser, ARTIFACTS / "failed-without-yearly.png"):
        browser.get(f"{server.url}/asset-groups")
        wait_for_graph_nodes(browser, declared, TIMEOUT_S)
        assert removed not in declared
        assert drawn_graph_nodes(browser, everything) == declared
        with pytest.raises(AssertionError, match=removed):
            wait_for_graph_nodes(browser, everything, timeout_s=2)
        screenshot(browser, ARTIFACTS / "lineage-without-yearly.png")
