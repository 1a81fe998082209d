"""Operator actions as Dagster jobs with typed config, launchable from the launchpad.

They call the same `Operations` API as the CLI, and are recorded the same way.
"""

from typing import Literal

import dagster as dg
from pydantic import Field

from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import parse_instant
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.tags import TAG_OPERATOR
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.services.columns import ColumnAction, change_column
from rollup_assets.services.operations import Operations


class RecomputeConfig(dg.Config):
    rollup: str = Field(description="Rollup to recompute, e.g. energy_daily")
    start: str = Field(
        description="ISO-8601 start (inclusive) of the range; covering buckets are recomputed"
    )
    end: str = Field(description="ISO-8601 end (exclusive) of the range")
    entities: list[str] = Field(
        default_factory=list, description="Only these entity ids (empty: all)"
    )


class FreezeConfig(dg.Config):
    rollup: str = Field(description="Rollup to freeze")
    until: str = Field(
        description="ISO-8601 instant; buckets ending at or before it are not written"
    )


class UnfreezeConfig(dg.Config):
    rollup: str = Field(description="Rollup to unfreeze")
    accept_gaps: bool = Field(default=False, description="Recorded for audit")


class RewindConfig(dg.Config):
    rollup: str = Field(description="Rollup whose watermark moves back (destructive)")
    to: str = Field(description="ISO-8601 bucket boundary to rewind to")


class RollbackConfig(dg.Config):
    rollup: str = Field(description="Rollup whose recompute job is undone, e.g. energy_daily")
    job_id: str = Field(description="Id of the recompute job to undo (see `rollups history`)")


class LifecycleConfig(dg.Config):
    archive: str = Field(description="Archive (raw, time-range or rollup)")
    action: Literal["activate", "disable", "enable", "delete"] = Field(
        description="Lifecycle transition"
    )


class ColumnConfig(dg.Config):
    archive: str = Field(description="Raw or time-range archive, e.g. energy_raw")
    column: str = Field(description="Computed column, as the spec declares it (or no longer does)")


def build_operator_jobs(catalog: Catalog, scope: Scope = NO_TENANT) -> list[dg.JobDefinition]:
    """The operator jobs of `scope` (a tenant's act on its own warehouse only)."""
    resources = {scope.warehouse_key}

    def ops(context: dg.OpExecutionContext) -> Operations:
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        return Operations(warehouse.engine(catalog), actor=f"dagster:{context.run_id}")

    @dg.op(name=scope.name("queue_recompute"), required_resource_keys=resources)
    def queue_recompute(context: dg.OpExecutionContext, config: RecomputeConfig):
        job = ops(context).request_recompute(
            config.rollup,
            parse_instant(config.start, "start"),
            parse_instant(config.end, "end"),
            frozenset(config.entities) or None,
        )
        context.log.info(
            "queued manual recompute %s of %s (%d window span(s))",
            job.job_id,
            config.rollup,
            len(job.windows),
        )
        context.add_output_metadata({"job_id": job.job_id})
        return job.job_id

    @dg.op(name=scope.name("freeze"), required_resource_keys=resources)
    def freeze(context: dg.OpExecutionContext, config: FreezeConfig):
        state = ops(context).freeze(config.rollup, parse_instant(config.until, "until"))
        context.log.info("%s frozen until %s", config.rollup, state.frozen_until)

    @dg.op(name=scope.name("unfreeze"), required_resource_keys=resources)
    def unfreeze(context: dg.OpExecutionContext, config: UnfreezeConfig):
        ops(context).unfreeze(config.rollup, config.accept_gaps)
        context.log.info("%s unfrozen (accept_gaps=%s)", config.rollup, config.accept_gaps)

    @dg.op(name=scope.name("rewind"), required_resource_keys=resources)
    def rewind(context: dg.OpExecutionContext, config: RewindConfig):
        state, deleted = ops(context).rewind(config.rollup, parse_instant(config.to, "to"))
        context.log.info(
            "%s rewound to %s; %d recomputed row(s) dropped",
            config.rollup,
            state.watermark,
            deleted,
        )

    @dg.op(name=scope.name("rollback"), required_resource_keys=resources)
    def rollback(context: dg.OpExecutionContext, config: RollbackConfig):
        out = ops(context).rollback(config.rollup, config.job_id)
        context.log.info(
            "%s: job %s undid job %s on %d bucket(s) (generation(s) %s active again); "
            "%d recompute job(s) queued above",
            config.rollup,
            out.job.job_id,
            config.job_id,
            len(out.cells),
            list(out.generations),
            len(out.propagated),
        )
        context.add_output_metadata(
            {
                "rollback_job": out.job.job_id,
                "undid": config.job_id,
                "genmap_version": out.version,
                "queued_above": [j.job_id for j in out.propagated],
            }
        )

    @dg.op(name=scope.name("change_status"), required_resource_keys=resources)
    def change_status(context: dg.OpExecutionContext, config: LifecycleConfig):
        o = ops(context)
        state = getattr(o, config.action)(config.archive)
        context.log.info("%s is now %s", config.archive, state.status.value)

    def column_op(action: ColumnAction) -> dg.OpDefinition:
        @dg.op(
            name=scope.name(f"{action.value.replace('-', '_')}_column"),
            required_resource_keys=resources,
        )
        def _op(context: dg.OpExecutionContext, config: ColumnConfig) -> None:
            warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
            result = change_column(
                warehouse.engine(catalog),
                config.archive,
                config.column,
                action,
                actor=f"dagster:{context.run_id}",
            )
            context.log.info(
                "%s of computed column %s.%s committed at version %d (%d rows rewritten, %d "
                "re-ingested; change detection recomputes %s)",
                action.value,
                config.archive,
                config.column,
                result.version,
                result.rows,
                result.reingested,
                ", ".join(result.recomputed) or "no rollup",
            )
            context.add_output_metadata(
                {
                    "version": result.version,
                    "rows_rewritten": result.rows,
                    "recomputed_by_detection": result.recomputed,
                }
            )

        return _op

    def job(name: str, op: dg.OpDefinition, description: str) -> dg.JobDefinition:
        @dg.job(
            name=scope.name(name),
            description=scope.describe(description),
            tags={TAG_OPERATOR: "true", **scope.tags()},
        )
        def _job() -> None:
            op()

        return _job

    return [
        job(
            "recompute_rollup",
            queue_recompute,
            "Queue a manual, reader-safe recompute of a range (the "
            "retroactive-write sensor launches it; dependents follow by chain propagation).",
        ),
        job(
            "freeze_rollup",
            freeze,
            "Stop every path from writing buckets that end at or before `until`.",
        ),
        job("unfreeze_rollup", unfreeze, "Lift the freeze; pending work drains on the next tick."),
        job(
            "rewind_rollup",
            rewind,
            "Move the watermark back so the forward lane re-aggregates (destructive).",
        ),
        job(
            "rollback_rollup",
            rollback,
            "Undo a recompute job: its cells get back the generation it replaced, in one pointer "
            "commit; the levels above are recomputed by chain propagation.",
        ),
        job(
            "change_archive_status",
            change_status,
            "Activate, disable, enable or delete an archive.",
        ),
        job(
            "add_computed_column",
            column_op(ColumnAction.ADD),
            "Add a computed column the spec declares: rows computed out of sight, one commit "
            "makes it visible.",
        ),
        job(
            "set_column_formula",
            column_op(ColumnAction.SET_FORMULA),
            "Apply a computed column's new formula in one commit; its rollups are recomputed.",
        ),
        job(
            "remove_computed_column",
            column_op(ColumnAction.REMOVE),
            "Remove a computed column the spec no longer declares, in one commit.",
        ),
    ]
