"""Writing readings into a raw or time-range archive from an asset of your own.

`build_definitions` binds one `RawArchives` per scope, under the resource key `raw_archives`
(a tenant's: `raw_archives__<tenant>`, over its own warehouse only). An asset that produces
readings takes it as a parameter and writes them, all or nothing, exactly as a file ingest would:

    import dagster as dg
    import pandas as pd
    from rollup_assets.orchestration.raw_archives import RawArchives

    @dg.asset
    def meter_readings(
        context: dg.AssetExecutionContext, raw_archives: dg.ResourceParam[RawArchives]
    ) -> dg.MaterializeResult:
        readings = pd.DataFrame({"entity_id": [...], "ts": [...], "energy_kwh": [...]})
        written = raw_archives.ingest(context, archive="meter_raw", data=readings)
        return dg.MaterializeResult(metadata={"meter_raw_version": written.version})

The write is a Pipeline change whose commit names the run and the asset; the archive's asset
records it at once (an observation with the commit's version and the rows inserted, updated and
unchanged), and the retroactive-write sensor then records it as it records every commit (a CLI
ingest's alike) and recomputes what it made dirty.
"""

import dagster as dg

from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import Catalog
from rollup_assets.model.windows import iso_utc
from rollup_assets.orchestration.resources import WarehouseResource
from rollup_assets.orchestration.tenancy import Scope
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.services.engine import Engine
from rollup_assets.services.ingest import Readings, ingest


class RawArchives:
    """The raw and time-range archives of one scope, writable from a run's asset or op."""

    def __init__(self, engine: Engine, scope: Scope) -> None:
        self.engine = engine
        self.scope = scope

    def ingest(
        self,
        context: dg.AssetExecutionContext | dg.OpExecutionContext,
        *,
        archive: str,
        data: Readings,
    ) -> IngestResult:
        """Upsert `data` (a pandas DataFrame, a pyarrow Table, RecordBatch or
        RecordBatchReader, a Spark DataFrame, or a Parquet or CSV file's path) into the
        activated raw or time-range `archive` in one commit, as `rollups ingest` does: a bad
        row raises IngestValidationError naming its 0-based position in `data`, and nothing is
        written. Records the write on the archive's asset and returns the ingest's result."""
        written_by = writer_of(context)
        result = ingest(self.engine, archive, data, ChangeSource.PIPELINE, written_by=written_by)
        context.log_event(
            dg.AssetObservation(
                asset_key=self.scope.key(archive), metadata=write_metadata(result, written_by)
            )
        )
        context.log.info(
            "wrote %s rows into '%s' (commit %s: %s inserted, %s updated, %s unchanged)",
            result.rows,
            archive,
            result.version,
            result.inserted,
            result.updated,
            result.unchanged,
        )
        return result


def writer_of(context: dg.AssetExecutionContext | dg.OpExecutionContext) -> str:
    """Who writes: the run, and the asset (or op) writing."""
    op = context.op_execution_context if isinstance(context, dg.AssetExecutionContext) else context
    what = (
        f"asset {op.asset_key.to_user_string()}"
        if op.has_assets_def and len(op.assets_def.keys) == 1
        else f"op {op.op_def.name}"
    )
    return f"run {op.run_id}, {what}"


def write_metadata(result: IngestResult, written_by: str) -> dict[str, str | int]:
    """What the archive's asset records of a write: the sensor's keys for a commit it detects
    (`delta_version`, `change_source`, `min_ts`, `max_ts`), and what the upsert did."""
    return {
        "delta_version": result.version,
        "change_source": result.change_source.value,
        "min_ts": iso_utc(result.min_ts),
        "max_ts": iso_utc(result.max_ts),
        "rows": result.rows,
        "inserted": result.inserted,
        "updated": result.updated,
        "unchanged": result.unchanged,
        "entities": result.entities,
        "written_by": written_by,
    }


def build_raw_archives(catalog: Catalog, scope: Scope) -> dg.ResourceDefinition:
    """The `RawArchives` resource of `scope`, over its own warehouse resource."""

    def raw_archives(init: dg.InitResourceContext) -> RawArchives:
        warehouse: WarehouseResource = getattr(init.resources, scope.warehouse_key)
        return RawArchives(warehouse.engine(catalog), scope)

    return dg.ResourceDefinition(
        resource_fn=raw_archives,
        required_resource_keys={scope.warehouse_key},
        description=scope.describe(
            "Writes readings (a DataFrame, an Arrow table or stream, a file) into a raw or "
            "time-range archive from an asset: `raw_archives.ingest(context, archive=..., "
            "data=...)`."
        ),
    )
