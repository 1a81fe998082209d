"""Two tenants in one code location: a correction in one is detected and recomputed there, and
the other's tables (every Delta table version under its root), runs and ledger stay exactly as
they were."""

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from deltalake import DeltaTable

from rollup_assets.assembly import build_definitions
from rollup_assets.demo.sample_data import day_batch
from rollup_assets.model.jobs import ChangeSource, JobState, Trigger
from rollup_assets.model.placement import buckets_in
from rollup_assets.model.spec_loader import load_catalog
from rollup_assets.model.specs import Catalog, RawArchiveSpec
from rollup_assets.model.windows import Window
from rollup_assets.orchestration.partitions import key_range_for, partitions_def_for
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import RunReport, execute, tick_until_quiet
from rollup_assets.orchestration.tags import TAG_TENANT, partition_range_tags
from rollup_assets.resources.warehouse import Warehouse, tenant_warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.operations import Operations
from rollup_assets.services.query import query_arrow
from rollup_assets.settings import DEFAULT_SPECS, Settings
from tests.conftest import days, instance_in
from tests.oracle import compare_all, raw_frame

NOW = datetime(2025, 6, 20, 12, 0, tzinfo=UTC)
FIRST = date(2025, 6, 2)
DAYS = 5
METER = "meter-0001"
# The local (Vienna) day 2025-06-04 is 2025-06-03 22:00Z .. 2025-06-04 22:00Z.
DAY_START = datetime(2025, 6, 3, 22, 0, tzinfo=UTC)


@dataclass
class Tenancy:
    root: Path
    catalog: Catalog
    defs: dg.Definitions
    instance: dg.DagsterInstance
    engines: dict[str, Engine]

    def ingest(self, tenant: str, table: pa.Table, source: str) -> None:
        path = self.root / f"{tenant}-{datetime.now().timestamp()}.parquet"
        pq.write_table(table, path)
        spec = self.catalog.archive("energy_raw")
        self.engines[tenant].raw.ingest(spec, path, ChangeSource(source))

    def tick(self, tenant: str, sensors: tuple[str, ...] | None = None) -> list[RunReport]:
        kwargs = {"sensors": sensors} if sensors else {}
        reports = tick_until_quiet(self.defs, self.instance, NOW, tenant=tenant, **kwargs)
        runs = [r for rep in reports for r in rep.runs]
        assert all(r.success for r in runs), [f"{r.job_name}: {r.error}" for r in runs]
        return runs

    def backfill(self, tenant: str) -> None:
        """The closed hours of the ingested days through `tenant`'s hourly job, then the chain."""
        engine = self.engines[tenant]
        spec = self.catalog.rollup("energy_hourly")
        mark = engine.states.get("energy_hourly").watermark
        assert mark is not None
        start = datetime(FIRST.year, FIRST.month, FIRST.day, tzinfo=UTC)
        span = Window(start, start + timedelta(days=DAYS))
        keys = key_range_for(
            partitions_def_for(spec), [w for w in buckets_in(spec, [span]) if w.end <= mark]
        )
        run = execute(
            self.defs,
            self.instance,
            f"{tenant}__energy_hourly_job",
            partition_range_tags(keys.start, keys.end),
        )
        assert run is not None and run.success, run and run.error
        dagster_run = self.instance.get_run_by_id(run.run_id)
        assert dagster_run is not None and dagster_run.tags[TAG_TENANT] == tenant
        self.tick(tenant, sensors=("retroactive_write_sensor",))
        self.tick(tenant)

    def mismatches(self, tenant: str) -> list[str]:
        """Differences between every level of `tenant` and the oracle over its raw rows."""
        engine = self.engines[tenant]
        spec = self.catalog.archive("energy_raw")
        assert isinstance(spec, RawArchiveSpec)
        raw = raw_frame(engine.raw.read_arrow(spec), spec)
        return compare_all(lambda name, **kw: query_arrow(engine, name, **kw), raw, self.catalog)

    def runs_of(self, tenant: str) -> dict[str, dg.DagsterRunStatus]:
        records = self.instance.get_run_records(filters=dg.RunsFilter(tags={TAG_TENANT: tenant}))
        return {r.dagster_run.run_id: r.dagster_run.status for r in records}


def delta_versions(root: Path) -> dict[str, int]:
    """Every Delta table under `root` (by its path) and its current version."""
    return {
        str(log.parent.relative_to(root)): DeltaTable(str(log.parent)).version()
        for log in sorted(root.rglob("_delta_log"))
    }


@pytest.fixture
def tenancy(tmp_path: Path, spark) -> Iterator[Tenancy]:
    doc = yaml.safe_load(DEFAULT_SPECS.read_text())
    # globex keeps its tables under a root of its own; acme under the default one.
    doc["tenants"] = {"acme": {}, "globex": {"warehouse": str(tmp_path / "globex-root")}}
    spec_file = tmp_path / "tenants.yaml"
    spec_file.write_text(yaml.safe_dump(doc))
    catalog = load_catalog(spec_file)
    wh = tmp_path / "warehouse"
    home = tmp_path / "dagster_home"
    home.mkdir()
    defs = build_definitions(
        catalog, WarehouseResource(root=str(wh)), settings=Settings(warehouse=str(wh))
    )
    engines = {
        t: Engine(catalog, tenant_warehouse(Warehouse(str(wh)), catalog, t))
        for t in ("acme", "globex")
    }
    with instance_in(home, catalog) as instance:
        yield Tenancy(tmp_path, catalog, defs, instance, engines)


def correction() -> pa.Table:
    """acme's meter's readings of one local day, replaced by tripled values."""
    batch = pa.concat_tables(
        [day_batch(d, 3, seed=4) for d in (date(2025, 6, 3), date(2025, 6, 4))]
    )
    ts = batch["ts"]
    keep = pc.and_(
        pc.equal(batch["entity_id"], METER),
        pc.and_(
            pc.greater_equal(ts, pa.scalar(DAY_START, ts.type)),
            pc.less(ts, pa.scalar(DAY_START + timedelta(days=1), ts.type)),
        ),
    )
    day = batch.filter(keep)
    return day.set_column(2, "energy_kwh", pc.multiply(day["energy_kwh"], 3.0))


def test_a_correction_in_one_tenant_never_touches_another(tenancy: Tenancy) -> None:
    t = tenancy
    seeds = {"acme": 4, "globex": 9}  # different readings, so a leak would show in the values
    for tenant, seed in seeds.items():
        ops = Operations(t.engines[tenant], actor="test")
        ops.activate("energy_raw", now=NOW)
        t.ingest(
            tenant,
            pa.concat_tables([day_batch(d, 3, seed=seed) for d in days(FIRST, DAYS)]),
            "Import",
        )
        for name in t.catalog.rollups:
            ops.activate(name, now=NOW)
        t.backfill(tenant)
        assert t.mismatches(tenant) == []
    acme_root = t.engines["acme"].warehouse.root
    globex_root = t.engines["globex"].warehouse.root
    assert acme_root == str(t.root / "warehouse" / "tenants" / "acme")
    assert globex_root == str(t.root / "globex-root")
    assert t.runs_of("acme") and t.runs_of("globex")

    # globex, before acme's correction: every table's version, every run, the whole ledger.
    tables_before = delta_versions(Path(globex_root))
    assert "_control/ledger" in tables_before and "rollups/energy_yearly" in tables_before
    runs_before = t.runs_of("globex")
    ledger_before = t.engines["globex"].ledger.snapshot().jobs
    values_before = {n: query_arrow(t.engines["globex"], n) for n in t.catalog.rollups}
    acme_jobs_before = set(t.engines["acme"].ledger.snapshot().jobs)
    marker = t.instance.event_log_storage.get_maximum_record_id() or 0

    corrected_at = datetime.now(UTC)
    t.ingest("acme", correction(), "Manual")
    runs = t.tick("acme")

    # acme detected the correction and recomputed it, with its own runs and ledger.
    assert runs and all(r.job_name.startswith("acme__") for r in runs)
    assert {r.run_id for r in runs} <= set(t.runs_of("acme"))
    new_jobs = [
        j
        for j in t.engines["acme"].ledger.snapshot().jobs.values()
        if j.job_id not in acme_jobs_before
        and j.trigger in (Trigger.PERIODIC, Trigger.CHAIN)
        and j.state is JobState.COMPLETED
        and j.windows_processed
    ]
    assert {j.rollup for j in new_jobs} >= {"energy_hourly", "energy_daily", "energy_weekly"}
    assert all(j.entities == frozenset({METER}) for j in new_jobs)
    assert all(j.created_at >= corrected_at for j in new_jobs)
    assert t.mismatches("acme") == []
    materialized = {
        key.to_user_string()
        for key in t.defs.resolve_asset_graph().get_all_asset_keys()
        if t.instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=key, after_storage_id=marker), limit=1
        ).records
    }
    assert "acme/energy_daily" in materialized
    assert not {k for k in materialized if k.startswith("globex/")}

    # globex: not one table version, run or ledger entry changed, and its values are its own.
    assert delta_versions(Path(globex_root)) == tables_before
    assert t.runs_of("globex") == runs_before
    assert t.engines["globex"].ledger.snapshot().jobs == ledger_before
    for name, before in values_before.items():
        assert query_arrow(t.engines["globex"], name).equals(before), name
    assert t.mismatches("globex") == []
    # acme's tables stay under acme's root; nothing is written at the configured root itself.
    assert sorted(p.name for p in (t.root / "warehouse").iterdir()) == ["tenants"]
    assert sorted(p.name for p in (t.root / "warehouse" / "tenants").iterdir()) == ["acme"]

    # globex's own sensors see nothing to do: acme's commit is not in globex's change feed.
    assert t.tick("globex") == []
