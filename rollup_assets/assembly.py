"""Assembling the Definitions of a catalog: every asset, check, job, sensor, schedule and
resource, per tenant. No side effects on import: the code location (`definitions.py`) and the
reusable component (`component.py`) call `build_definitions` with what they read.
"""

import dagster as dg

from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import iso_utc
from rollup_assets.orchestration.assets import build_raw_spec, build_rollup_asset
from rollup_assets.orchestration.checks import build_check_job, build_rollup_check
from rollup_assets.orchestration.jobs import build_rollup_job
from rollup_assets.orchestration.maintenance_jobs import build_maintenance
from rollup_assets.orchestration.operator_jobs import build_operator_jobs
from rollup_assets.orchestration.raw_archives import build_raw_archives
from rollup_assets.orchestration.resources import (
    ClockResource,
    SparkResource,
    WarehouseResource,
    register_built,
)
from rollup_assets.orchestration.surface_jobs import build_publish_job
from rollup_assets.orchestration.tenancy import Scope, scopes_of
from rollup_assets.resources.warehouse import tenant_warehouses
from rollup_assets.sensors.definitions import build_sensors, build_surface_sensor
from rollup_assets.settings import Settings


def _scope_definitions(catalog: Catalog, scope: Scope, settings: Settings) -> dg.Definitions:
    """Every asset, check, job, sensor and schedule of one scope (one tenant, or the code
    location without tenants), each bound to the scope's own warehouse resource."""
    rollup_jobs = [build_rollup_job(spec, scope) for spec in catalog.rollups.values()]
    maintenance_job, maintenance_schedule = build_maintenance(catalog, scope)
    publish_job = build_publish_job(catalog, scope)
    return dg.Definitions(
        assets=[
            *[build_raw_spec(name, catalog, scope) for name in [*catalog.raw, *catalog.time_range]],
            *[build_rollup_asset(spec, catalog, scope) for spec in catalog.rollups.values()],
        ],
        asset_checks=[
            build_rollup_check(spec, catalog, scope) for spec in catalog.rollups.values()
        ],
        jobs=[
            *rollup_jobs,
            *[build_check_job(spec, scope) for spec in catalog.rollups.values()],
            *build_operator_jobs(catalog, scope),
            maintenance_job,
            publish_job,
        ],
        sensors=[
            *build_sensors(
                catalog, rollup_jobs, settings.sensor_interval_seconds, settings.limits, scope
            ),
            build_surface_sensor(
                catalog,
                publish_job,
                settings.sensor_interval_seconds,
                settings.surface_max_lag_seconds,
                scope,
            ),
        ],
        schedules=[maintenance_schedule],
    )


def warehouse_resources(catalog: Catalog, base: WarehouseResource) -> dict[str, WarehouseResource]:
    """The warehouse resource of each scope, by resource key: `base` alone without tenants;
    with tenants, one per tenant over its own root (and no resource over `base` itself)."""
    if not catalog.tenants:
        return {Scope().warehouse_key: base}
    roots = tenant_warehouses(base.get(), catalog)
    return {
        # A fresh resource per tenant: a copy would share `base`'s engines, and with them its root.
        Scope(name).warehouse_key: WarehouseResource(**{**base.model_dump(), "root": wh.root})
        for name, wh in roots.items()
    }


def build_definitions(
    catalog: Catalog,
    warehouse: WarehouseResource | None = None,
    *,
    settings: Settings,
) -> dg.Definitions:
    """Every asset, check, job, sensor and schedule of `catalog`, with resources from `settings`
    (what the edge read with `Settings.from_env()`, or `Settings()` for the documented
    defaults: required, so a definitions module cannot drop them unseen); `warehouse` overrides
    the warehouse resource. With tenants
    declared, each tenant gets its own copy of everything, prefixed by its name and bound to
    its own warehouse (`Scope`), so nothing of one tenant can reach another's tables."""
    base = warehouse or WarehouseResource.from_settings(settings)
    warehouses = warehouse_resources(catalog, base)
    defs = dg.Definitions.merge(
        *[_scope_definitions(catalog, scope, settings) for scope in scopes_of(catalog)],
        dg.Definitions(
            resources={
                "spark": SparkResource(
                    master=settings.spark_master,
                    remote=settings.spark_remote,
                    delta_jars=str(settings.delta_jars),
                    python=settings.pyspark_python,
                    java_home=str(settings.java_home) if settings.java_home else None,
                    warm_server_dir=str(settings.warm_spark_dir)
                    if settings.uses_warm_spark
                    else None,
                ),
                **warehouses,
                **{
                    scope.raw_archives_key: build_raw_archives(catalog, scope)
                    for scope in scopes_of(catalog)
                },
                "clock": ClockResource(now=iso_utc(settings.now) if settings.now else None),
            },
            executor=dg.in_process_executor,
        ),
    )
    register_built(catalog, list(warehouses.values()))  # what a run worker prepares
    return defs
