"""The surface publish job: brings the surfaces of the rollups it is given up to date, off the
correction's critical path (the surface publish sensor launches it; so can you, from the
launchpad). Its op holds no pool: a publish changes no rollup row or pointer, only the surface
table, and is fenced by the versions it records (`services.surface`), so it neither waits for a
rollup's recompute nor holds one up.
"""

from datetime import UTC, datetime

import dagster as dg
from pydantic import Field

from rollup_assets.model.specs import Catalog
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.tenancy import NO_TENANT, Scope
from rollup_assets.services.surface import publish
from rollup_assets.services.surface_lag import surface_lag


class PublishConfig(dg.Config):
    rollups: list[str] = Field(
        default_factory=list,
        description="Rollups whose surface tables to publish (empty: every activated rollup)",
    )


def publish_job_name(scope: Scope = NO_TENANT) -> str:
    return scope.name("publish_surfaces")


def publish_op_name(scope: Scope = NO_TENANT) -> str:
    return scope.name("publish_surface_tables")


def build_publish_job(catalog: Catalog, scope: Scope = NO_TENANT) -> dg.JobDefinition:
    """`scope`'s publish job (a tenant's publishes its own warehouse's surfaces)."""

    @dg.op(name=publish_op_name(scope), required_resource_keys={scope.warehouse_key})
    def publish_surface_tables(context: dg.OpExecutionContext, config: PublishConfig) -> None:
        warehouse: WarehouseResource = getattr(context.resources, scope.warehouse_key)
        engine = warehouse.engine(catalog)
        states = engine.states.all()
        names = config.rollups or [n for n in catalog.rollups if n in states]
        failed = []
        for name in names:
            spec = catalog.rollup(name)
            lag = surface_lag(engine, spec)
            try:
                done = publish(engine, spec)
            except Exception as exc:  # the other surfaces are still published
                context.log.warning("%s: surface publish failed: %s", name, exc)
                failed.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            now = datetime.now(UTC)
            closed = lag.seconds(now)
            # Flips that landed while it published lag it again at once.
            left = surface_lag(engine, spec).seconds(now)
            context.log.info(
                "%s: surface at pointer version %d, row version %d (lag closed: %s s; %d "
                "file(s) replaced by %d, %d row(s) read, %d written)",
                name,
                done.reflects.genmap,
                done.reflects.rows,
                "unknown" if closed is None else f"{closed:.1f}",
                done.files_removed,
                done.files_added,
                done.surface_rows_read,
                done.file_rows_written,
            )
            context.log_event(
                dg.AssetObservation(
                    asset_key=scope.key(name),
                    metadata={
                        "surface_lag_seconds": -1.0 if left is None else round(left, 3),
                        "surface_lag_closed_seconds": -1.0 if closed is None else round(closed, 3),
                        "surface_genmap_version": done.reflects.genmap,
                        "surface_rows_version": done.reflects.rows,
                        "surface_rebuilt": done.rebuilt,
                        "surface_rows_read": done.surface_rows_read,
                        "surface_rows_written": done.file_rows_written,
                        "surface_bytes_written": done.bytes_written,
                        "surface_files_replaced": done.files_removed,
                    },
                )
            )
        if failed:
            raise dg.Failure(description="; ".join(failed))

    @dg.job(
        name=publish_job_name(scope),
        description=scope.describe(
            "Bring the surface tables (the active rows plain Delta readers see) of the given "
            "rollups up to date; the surface publish sensor launches it for lagging surfaces."
        ),
        tags=scope.tags(),
    )
    def publish_surfaces() -> None:
        publish_surface_tables()

    return publish_surfaces
