"""The maintenance job and its daily schedule: raw retention, then upkeep of every table."""

import dagster as dg
from pydantic import Field

from rollup_assets.model.specs import Catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.services.maintenance import DEFAULT_RETENTION_HOURS, maintain


class MaintenanceConfig(dg.Config):
    retention_hours: int = Field(
        default=DEFAULT_RETENTION_HOURS,
        description=(
            "Vacuum keeps unreferenced files younger than this; "
            "keep it above the longest read or run (never less than the generation retention "
            "is used). (An archive's raw retention is its spec's `retention`.)"
        ),
    )


def build_maintenance(
    catalog: Catalog, scope: Scope = NO_TENANT
) -> tuple[dg.JobDefinition, dg.ScheduleDefinition]:
    """The maintenance job and schedule of `scope` (a tenant's maintain its own warehouse)."""

    @dg.op(name=scope.name("maintain_tables"), required_resource_keys={scope.warehouse_key})
    def maintain_tables(context: dg.OpExecutionContext, config: MaintenanceConfig):
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        report = maintain(warehouse.engine(catalog), retention_hours=config.retention_hours)
        for line in report.details:
            context.log.info(line)
        context.add_output_metadata(
            {
                "raw_days_dropped": report.raw_days_dropped,
                "raw_rows_dropped": report.raw_rows_dropped,
                "tables": report.tables,
                "files_compacted": report.files_compacted,
                "files_vacuumed": report.files_vacuumed,
                "rows_swept": report.rows_swept,
                "failures": dg.MetadataValue.json(report.failures),
            }
        )
        failed = [o.describe() for o in report.retention if o.error] + report.failures
        if failed:
            # The other archives and the upkeep went on; the run still says what failed.
            raise dg.Failure(description="; ".join(failed))

    @dg.job(
        name=scope.name("maintain_warehouse"),
        description=scope.describe(
            "Drop raw days older than each archive's retention, then checkpoint, "
            "compact, sweep and vacuum every table."
        ),
        tags=scope.tags(),
    )
    def maintain_warehouse() -> None:
        maintain_tables()

    schedule = dg.ScheduleDefinition(
        name=scope.name("nightly_maintenance"),
        job=maintain_warehouse,
        cron_schedule="30 2 * * *",
        execution_timezone="UTC",
        default_status=dg.DefaultScheduleStatus.RUNNING,
    )
    return maintain_warehouse, schedule
