"""The code location: one Definitions assembled explicitly from the declared specs."""

import dagster as dg

from resources.spark import SparkResource
from resources.warehouse_resource import WarehouseResource
from rollup_assets.factory import (
    build_check_job,
    build_raw_spec,
    build_rollup_asset,
    build_rollup_check,
    build_rollup_job,
)
from rollup_assets.maintenance_jobs import build_maintenance
from rollup_assets.operator_jobs import build_operator_jobs
from rollup_assets.specs import Catalog, load_catalog
from sensors.definitions import build_sensors


def build_definitions(
    catalog: Catalog, warehouse: WarehouseResource | None = None
) -> dg.Definitions:
    rollup_jobs = [build_rollup_job(spec) for spec in catalog.rollups.values()]
    maintenance_job, maintenance_schedule = build_maintenance(catalog)
    return dg.Definitions(
        assets=[
            *[build_raw_spec(name, catalog) for name in [*catalog.raw, *catalog.time_range]],
            *[build_rollup_asset(spec, catalog) for spec in catalog.rollups.values()],
        ],
        asset_checks=[build_rollup_check(spec, catalog) for spec in catalog.rollups.values()],
        jobs=[
            *rollup_jobs,
            *[build_check_job(spec) for spec in catalog.rollups.values()],
            *build_operator_jobs(catalog),
            maintenance_job,
        ],
        sensors=build_sensors(catalog, rollup_jobs),
        schedules=[maintenance_schedule],
        resources={"spark": SparkResource(), "warehouse": warehouse or WarehouseResource()},
        executor=dg.in_process_executor,
    )


catalog = load_catalog()
defs = build_definitions(catalog)
