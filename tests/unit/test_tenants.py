"""Tenants: the spec section and its rules, each tenant's warehouse root, the per-tenant Dagster
definitions (keys, names, pools, resources), and the CLI's `--tenant`. No Spark."""

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from click.testing import CliRunner, Result

from rollup_assets.assembly import build_definitions
from rollup_assets.cli import app as cli
from rollup_assets.cli import main
from rollup_assets.model.errors import SpecError, TenantError
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Catalog, Tenant
from rollup_assets.orchestration.instance import pool_names
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.runner import SENSORS
from rollup_assets.orchestration.tags import TAG_TENANT
from rollup_assets.resources.warehouse import Warehouse, tenant_warehouse, tenant_warehouses
from rollup_assets.settings import DEFAULT_SPECS, Settings

ROLLUPS = ["energy_hourly", "energy_daily", "energy_weekly", "energy_monthly", "energy_yearly"]


def shipped() -> dict[str, Any]:
    return yaml.safe_load(DEFAULT_SPECS.read_text())


def with_tenants(tenants: Any) -> dict[str, Any]:
    return {**shipped(), "tenants": tenants}


def write_spec(path: Path, tenants: Any) -> Path:
    path.write_text(yaml.safe_dump(with_tenants(tenants)))
    return path


# --- the spec -------------------------------------------------------------------------------


def test_tenants_get_every_declared_archive() -> None:
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {"warehouse": "/data/globex"}}))
    assert catalog.tenants == {
        "acme": Tenant("acme"),
        "globex": Tenant("globex", warehouse="/data/globex"),
    }
    assert list(catalog.rollups) == ROLLUPS


@pytest.mark.parametrize("section", [None, {}])
def test_no_tenants_section_means_no_tenants(section: Any) -> None:
    doc = shipped() if section is None else with_tenants(section)
    assert parse_catalog(doc).tenants == {}


def test_a_tenant_without_a_body_uses_the_default_root() -> None:
    assert parse_catalog(with_tenants({"acme": None})).tenants == {"acme": Tenant("acme")}


@pytest.mark.parametrize(
    ("tenants", "subject", "rule"),
    [
        ({"Acme": {}}, "tenants.Acme", "tenant name"),
        ({"a__b": {}}, "tenants.a__b", "tenant name"),
        ({"9lives": {}}, "tenants.9lives", "tenant name"),
        ({"acme": {"root": "/x"}}, "tenants.acme", "known keys"),
        ({"acme": "/x"}, "tenants.acme", "tenant body is a mapping"),
        ({"acme": {"warehouse": ""}}, "tenants.acme", "tenant warehouse"),
        ({"acme": {"warehouse": 3}}, "tenants.acme", "tenant warehouse"),
        (["acme"], "<memory>", "tenants is a mapping"),
    ],
)
def test_bad_tenants_are_refused_naming_the_tenant(tenants: Any, subject: str, rule: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_catalog(with_tenants(tenants))
    assert (err.value.archive, err.value.rule) == (subject, rule)


def test_the_unknown_top_level_key_message_lists_tenants() -> None:
    with pytest.raises(SpecError, match="tenants"):
        parse_catalog({**shipped(), "tenant": {"acme": {}}})


def test_a_command_must_name_a_declared_tenant_exactly_when_there_are_tenants() -> None:
    with_t = parse_catalog(with_tenants({"acme": {}, "globex": {}}), origin="t.yaml")
    assert with_t.tenant("acme") == Tenant("acme")
    with pytest.raises(TenantError, match=r"t.yaml declares tenants \(acme, globex\)"):
        with_t.tenant(None)
    with pytest.raises(TenantError, match=r"'initech' is not declared.*known: acme, globex"):
        with_t.tenant("initech")
    without = parse_catalog(shipped(), origin="plain.yaml")
    assert without.tenant(None) is None
    with pytest.raises(TenantError, match=r"plain\.yaml declares no tenants"):
        without.tenant("acme")


def test_rollups_tenant_is_read_from_the_environment() -> None:
    assert Settings.from_env({}).tenant is None
    assert Settings.from_env({"ROLLUPS_TENANT": " acme "}).tenant == "acme"


# --- warehouse roots ------------------------------------------------------------------------


def test_each_tenant_has_its_own_root(tmp_path: Path) -> None:
    other = tmp_path / "elsewhere" / "globex"
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {"warehouse": str(other)}}))
    base = Warehouse(str(tmp_path / "wh"), {"aws_region": "eu-central-1"})
    roots = tenant_warehouses(base, catalog)
    assert roots["acme"].root == str(tmp_path / "wh" / "tenants" / "acme")
    assert roots["globex"].root == str(other)
    assert roots["acme"].storage_options == {"aws_region": "eu-central-1"}
    # A rollup's surface table (for plain Delta readers) lives under its tenant's root too.
    assert roots["globex"].surface_path("energy_daily") == str(
        other / "rollups" / "energy_daily__active"
    )
    assert tenant_warehouse(base, catalog, "globex") == roots["globex"]
    with pytest.raises(TenantError):
        tenant_warehouse(base, catalog, None)
    plain = parse_catalog(shipped())
    assert tenant_warehouse(base, plain, None) is base


def test_object_store_roots_default_under_the_configured_uri() -> None:
    catalog = parse_catalog(with_tenants({"acme": {}}))
    roots = tenant_warehouses(Warehouse("s3://bucket/wh"), catalog)
    assert roots["acme"].root == "s3://bucket/wh/tenants/acme"


@pytest.mark.parametrize(
    "globex_root",
    [
        "{wh}",  # the configured warehouse itself, which holds every default tenant root
        "{wh}/tenants/acme",  # acme's default root
        "{wh}/tenants/acme/sub",  # inside acme's root
        "{tmp}",  # around the configured warehouse, so around acme's root
    ],
)
def test_overlapping_roots_are_refused(tmp_path: Path, globex_root: str) -> None:
    root = globex_root.format(wh=tmp_path / "wh", tmp=tmp_path)
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {"warehouse": root}}))
    with pytest.raises(SpecError) as err:
        tenant_warehouses(Warehouse(str(tmp_path / "wh")), catalog)
    assert err.value.rule == "separate tenant warehouses"
    assert err.value.archive in ("tenants.acme", "tenants.globex")


# Roots spelled differently that are one place, or one inside the other: (acme's, globex's).
SAME_PLACE = [
    ("/data/x", "/data/x/"),  # a trailing slash
    ("{tmp}/p", "file://{tmp}/p"),  # a path and its file URI
    ("{tmp}/p", "FILE:{tmp}/p/"),  # a file URI in capitals, without the empty authority
    ("p", "{tmp}/p"),  # a relative path and its absolute one
    ("{tmp}/q/../p", "{tmp}/p"),  # a `..` segment
    ("s3://b/t", "s3a://b/t"),  # Hadoop's S3 connector names S3
    ("s3://b/t", "S3N://b/t/"),  # the scheme in capitals, the retired s3n, a trailing slash
    ("s3://b/t", "s3://B/t"),  # the bucket in capitals
    ("s3://b/t", "s3://b//x/../t"),  # repeated slashes and `..` in a URI
    ("abfss://c@acct.dfs.core.windows.net/t", "abfs://c@acct.dfs.core.windows.net/t"),
]
NESTED = [
    ("{tmp}/p", "file://{tmp}/p/globex"),  # inside, as a file URI
    ("{tmp}/p/acme", "p"),  # around, as a relative path
    ("s3://b/t", "s3a://b/t/globex"),  # inside, through another S3 scheme
    ("s3://b/t/acme", "S3://b/t"),  # around, in capitals
    ("s3://b/t", "s3://b/x/../t/globex"),  # inside, once `..` is resolved
]


def _roots(tmp_path: Path, acme: str, globex: str) -> Catalog:
    roots = {"acme": acme.format(tmp=tmp_path), "globex": globex.format(tmp=tmp_path)}
    return parse_catalog(with_tenants({t: {"warehouse": r} for t, r in roots.items()}))


@pytest.mark.parametrize(("acme", "globex"), SAME_PLACE + NESTED)
def test_roots_are_compared_as_places_not_as_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, acme: str, globex: str
) -> None:
    monkeypatch.chdir(tmp_path)  # relative roots are taken from the working directory
    with pytest.raises(SpecError) as err:
        tenant_warehouses(Warehouse(str(tmp_path / "wh")), _roots(tmp_path, acme, globex))
    assert (err.value.archive, err.value.rule) == ("tenants.globex", "separate tenant warehouses")
    assert "tenant 'acme's warehouse" in str(err.value)
    relation = ("is",) if (acme, globex) in SAME_PLACE else ("lies inside", "holds")
    assert any(f" {r} tenant 'acme's" in str(err.value) for r in relation), str(err.value)


@pytest.mark.parametrize(
    "globex_root",
    ["{wh}/raw/x", "{wh}/rollups", "file://{wh}/_control/archives/x", "{wh}/../wh/raw"],
)
def test_a_root_inside_the_configured_warehouses_tables_is_refused(
    tmp_path: Path, globex_root: str
) -> None:
    root = globex_root.format(wh=tmp_path / "wh")
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {"warehouse": root}}))
    with pytest.raises(SpecError) as err:
        tenant_warehouses(Warehouse(str(tmp_path / "wh")), catalog)
    assert (err.value.archive, err.value.rule) == ("tenants.globex", "separate tenant warehouses")
    assert "inside the configured warehouse's tables" in str(err.value)


@pytest.mark.parametrize(
    ("acme", "globex"),
    [
        ("{tmp}/p", "{tmp}/pp"),  # a common prefix is not nesting
        ("s3://b/t", "s3://b/t2"),
        ("s3://b/t", "s3://c/t"),
        ("s3://b/t", "gs://b/t"),
        ("{tmp}/wh/other", "{tmp}/wh/tenants/x"),  # inside the configured root, beside its tables
    ],
)
def test_roots_that_are_apart_are_kept(tmp_path: Path, acme: str, globex: str) -> None:
    roots = tenant_warehouses(Warehouse(str(tmp_path / "wh")), _roots(tmp_path, acme, globex))
    assert roots["acme"].location != roots["globex"].location


# --- definitions ----------------------------------------------------------------------------


def definitions(catalog: Catalog, root: Path) -> dg.Definitions:
    return build_definitions(
        catalog, WarehouseResource(root=str(root)), settings=Settings(warehouse=str(root))
    )


@pytest.fixture(scope="module")
def tenant_defs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dg.Definitions, Path]:
    root = tmp_path_factory.mktemp("wh")
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {"warehouse": str(root / "g")}}))
    return definitions(catalog, root / "base"), root


def test_every_asset_is_prefixed_by_its_tenant(tenant_defs: tuple[dg.Definitions, Path]) -> None:
    defs, _ = tenant_defs
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    names = ["energy_raw", *ROLLUPS]
    assert keys == {f"{t}/{n}" for t in ("acme", "globex") for n in names}
    # The chain stays inside the tenant: acme's daily depends on acme's hourly only.
    parents = graph.get(dg.AssetKey(["acme", "energy_daily"])).parent_keys
    assert parents == {dg.AssetKey(["acme", "energy_hourly"])}
    checks = {c.asset_key.to_user_string() for c in graph.asset_check_keys}
    assert checks == {f"{t}/{n}" for t in ("acme", "globex") for n in ROLLUPS}


def test_jobs_sensors_and_schedules_are_named_per_tenant(
    tenant_defs: tuple[dg.Definitions, Path],
) -> None:
    defs, _ = tenant_defs
    repo = defs.get_repository_def()
    sensors = {s.name for s in repo.sensor_defs}
    assert sensors == {f"{t}__{s}" for t in ("acme", "globex") for s in SENSORS}
    assert {s.name for s in repo.schedule_defs} == {
        "acme__nightly_maintenance",
        "globex__nightly_maintenance",
    }
    jobs = {j.name for j in repo.get_all_jobs()}
    for t in ("acme", "globex"):
        assert {f"{t}__{r}_job" for r in ROLLUPS} <= jobs
        assert {f"{t}__{r}_check_job" for r in ROLLUPS} <= jobs
        assert {f"{t}__recompute_rollup", f"{t}__maintain_warehouse"} <= jobs
        assert repo.get_job(f"{t}__energy_daily_job").tags[TAG_TENANT] == t
        assert repo.get_job(f"{t}__freeze_rollup").tags[TAG_TENANT] == t
    assert not {"energy_daily_job", "retroactive_write_sensor", "recompute_rollup"} & (
        jobs | sensors
    )


def test_each_tenant_uses_only_its_own_warehouse(tenant_defs: tuple[dg.Definitions, Path]) -> None:
    defs, root = tenant_defs
    resources = defs.resources or {}
    assert "warehouse" not in resources
    assert resources["warehouse__acme"].root == str(root / "base" / "tenants" / "acme")
    assert resources["warehouse__globex"].root == str(root / "g")
    # An asset of the project writes readings into a tenant's raw archives through its own.
    assert {"raw_archives__acme", "raw_archives__globex"} <= set(resources)
    assert "raw_archives" not in resources
    repo = defs.get_repository_def()
    for tenant, other in (("acme", "globex"), ("globex", "acme")):
        for sensor in (f"{tenant}__{s}" for s in SENSORS):
            keys = repo.get_sensor_def(sensor).required_resource_keys
            # Its own warehouse, and the clock where it plans by it (the publish sensor does not).
            assert f"warehouse__{tenant}" in keys, sensor
            assert keys <= {f"warehouse__{tenant}", "clock"}, sensor
        for job in repo.get_all_jobs():
            if not job.name.startswith(f"{tenant}__"):
                continue
            for node in job.nodes_in_topological_order:
                keys = node.definition.required_resource_keys
                assert f"warehouse__{tenant}" in keys, (job.name, node.name)
                assert f"warehouse__{other}" not in keys, (job.name, node.name)


def test_pools_are_per_tenant_and_rollup(tenant_defs: tuple[dg.Definitions, Path]) -> None:
    defs, _ = tenant_defs
    graph = defs.resolve_asset_graph()
    pools = {
        key.to_user_string(): graph.get(key).pools
        for key in graph.get_all_asset_keys()
        if key.path[-1] in ROLLUPS
    }
    assert pools == {f"{t}/{r}": {f"rollup_{t}__{r}"} for t in ("acme", "globex") for r in ROLLUPS}
    catalog = parse_catalog(with_tenants({"acme": {}, "globex": {}}))
    assert sorted(pool_names(catalog)) == sorted(p for ps in pools.values() for p in ps)


def test_without_tenants_every_name_is_unchanged(tmp_path: Path) -> None:
    defs = definitions(load_catalog(), tmp_path)
    graph = defs.resolve_asset_graph()
    assert {k.to_user_string() for k in graph.get_all_asset_keys()} == {"energy_raw", *ROLLUPS}
    repo = defs.get_repository_def()
    assert {s.name for s in repo.sensor_defs} == set(SENSORS)
    assert {s.name for s in repo.schedule_defs} == {"nightly_maintenance"}
    assert {"energy_hourly_job", "recompute_rollup", "maintain_warehouse"} <= {
        j.name for j in repo.get_all_jobs()
    }
    assert TAG_TENANT not in repo.get_job("energy_hourly_job").tags
    assert sorted(defs.resources or {}) == ["clock", "raw_archives", "spark", "warehouse"]
    assert graph.get(dg.AssetKey("energy_daily")).pools == {"rollup_energy_daily"}


# --- the command line -----------------------------------------------------------------------

Invoke = Callable[..., Result]


@pytest.fixture
def rollups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Invoke]:
    (tmp_path / "home").mkdir()
    spec = write_spec(tmp_path / "specs.yaml", {"acme": {}, "globex": {}})
    monkeypatch.setenv("ROLLUPS_WAREHOUSE", str(tmp_path / "wh"))
    monkeypatch.setenv("DAGSTER_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("ROLLUPS_SPECS", str(spec))
    monkeypatch.delenv("ROLLUPS_TENANT", raising=False)
    monkeypatch.delenv("ROLLUPS_NOW", raising=False)

    def clear() -> None:
        for fn in (cli.settings, cli.catalog, cli.engine):
            fn.cache_clear()

    clear()
    runner = CliRunner()
    yield lambda *args: runner.invoke(main, [str(a) for a in args])
    clear()


def one_line_error(res: Result) -> str:
    assert res.exit_code != 0, res.output
    assert isinstance(res.exception, SystemExit), res.exception
    lines = res.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    return lines[0]


@pytest.mark.parametrize(
    "args",
    [
        ["status"],
        ["activate", "energy_raw"],
        ["jobs", "energy_hourly"],
        ["query", "energy_hourly"],
        ["freeze", "energy_hourly", "--until", "2025-06-01T00:00:00Z"],
        ["tick"],
        ["maintain"],
    ],
)
def test_commands_require_a_tenant_when_the_spec_declares_tenants(
    rollups: Invoke, tmp_path: Path, args: list[str]
) -> None:
    line = one_line_error(rollups(*args))
    assert "declares tenants (acme, globex)" in line and "--tenant NAME" in line
    assert not (tmp_path / "wh").exists()


def test_an_unknown_tenant_is_refused(rollups: Invoke, tmp_path: Path) -> None:
    line = one_line_error(rollups("status", "--tenant", "initech"))
    assert "tenant 'initech' is not declared" in line and "known: acme, globex" in line
    assert not (tmp_path / "wh").exists()


def test_a_tenant_is_refused_when_the_spec_declares_none(
    rollups: Invoke, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLUPS_SPECS", str(DEFAULT_SPECS))
    line = one_line_error(rollups("status", "--tenant", "acme"))
    assert "tenant 'acme' given" in line and "declares no tenants" in line


def test_a_command_writes_only_its_tenants_warehouse(
    rollups: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    res = rollups("activate", "energy_raw", "--tenant", "acme", "--format", "json")
    assert res.exit_code == 0, res.output
    acme, globex = tmp_path / "wh" / "tenants" / "acme", tmp_path / "wh" / "tenants" / "globex"
    assert (acme / "raw" / "energy_raw" / "_delta_log").is_dir()
    assert not globex.exists()
    assert sorted(p.name for p in (tmp_path / "wh").iterdir()) == ["tenants"]

    def status_of(*args: str) -> dict[str, str]:
        res = rollups("status", *args, "--format", "json")
        assert res.exit_code == 0, res.output
        return {row["archive"]: row["status"] for row in json.loads(res.stdout)}

    assert status_of("--tenant", "acme")["energy_raw"] == "Activated"
    assert status_of("--tenant", "globex")["energy_raw"] == "Created"
    # ROLLUPS_TENANT stands in for --tenant; the option wins over it.
    monkeypatch.setenv("ROLLUPS_TENANT", "acme")
    cli.settings.cache_clear()
    assert status_of()["energy_raw"] == "Activated"
    assert status_of("--tenant", "globex")["energy_raw"] == "Created"
    assert not globex.exists() or not (globex / "raw").exists()


def test_tenants_that_share_a_root_spelled_two_ways_are_refused_by_every_command(
    rollups: Invoke, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`/p` and `file:///p` are one directory: globex would open acme's tables."""
    tenants = {"acme": {"warehouse": str(tmp_path / "p")}, "globex": {"warehouse": "file:p"}}
    monkeypatch.setenv("ROLLUPS_SPECS", str(write_spec(tmp_path / "shared.yaml", tenants)))
    monkeypatch.chdir(tmp_path)
    for args in (["validate"], ["activate", "energy_raw", "--tenant", "acme"], ["status"]):
        args += ["--tenant", "globex"] if args == ["status"] else []
        line = one_line_error(rollups(*args))
        assert "spec 'tenants.globex'" in line and "[separate tenant warehouses]" in line
        assert f"is tenant 'acme's warehouse ({tmp_path / 'p'}" in line, line
    assert not (tmp_path / "p").exists()


def test_help_explains_the_tenant_option(rollups: Invoke) -> None:
    for command in ("ingest", "status", "tick", "recompute", "freeze", "verify", "maintain"):
        res = rollups(command, "--help")
        assert res.exit_code == 0 and "--tenant NAME" in res.stdout, command
