"""The engine: a catalog and the stores of one warehouse, shared by every use case.

It holds the guards every use case applies (an archive must be activated, with the spec it was
activated with) and computes a rollup's partials from its source. It is free of Dagster: a
Dagster resource provides it to runs and sensors, and the CLI and the tests build it directly.
"""

import logging
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from resources.archive_states import ArchiveStateStore
from resources.ledger import Ledger
from resources.raw_store import RawStore
from resources.rollup_store import RollupStore
from resources.warehouse import Warehouse
from rollup_assets.compute.aggregation import rollup_partials
from rollup_assets.model.errors import ArchiveNotActivatedError, ArchiveSchemaImmutableError
from rollup_assets.model.jobs import Job
from rollup_assets.model.specs import ArchiveSpec, Catalog, RollupSpec, schema_fingerprint
from rollup_assets.model.states import ArchiveState, ArchiveStatus
from rollup_assets.model.windows import Window, merge_windows

log = logging.getLogger(__name__)
TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True)
class RunOutcome:
    """What one rollup run did. `buckets` are the buckets it wrote (empty for a no-op)."""

    job: Job
    buckets: list[Window]
    rows: int = 0
    generation: int | None = None
    version: int | None = None
    source_versions: dict[str, int] = field(default_factory=dict)
    duration_ms: int = 0
    note: str = ""
    propagated: list[Job] = field(default_factory=list)  # pending jobs it queued one level up


class Engine:
    def __init__(self, catalog: Catalog, warehouse: Warehouse) -> None:
        self.catalog = catalog
        self.warehouse = warehouse
        self.raw = RawStore(warehouse)
        self.rollups = RollupStore(warehouse)
        self.states = ArchiveStateStore(warehouse)
        self.ledger = Ledger(warehouse)

    # -- guards ------------------------------------------------------------------------------

    def require_activated(
        self, spec: ArchiveSpec, state: ArchiveState | None = None
    ) -> ArchiveState:
        state = state or self.states.get(spec.name)
        if state.status is not ArchiveStatus.ACTIVATED:
            raise ArchiveNotActivatedError(
                f"archive '{spec.name}' is not activated (status {state.status.value}); "
                f"activate it first: rollups activate {spec.name}"
            )
        self.require_same_schema(spec, state)
        return state

    def require_same_schema(self, spec: ArchiveSpec, state: ArchiveState) -> None:
        if state.fingerprint and state.fingerprint != schema_fingerprint(spec):
            raise ArchiveSchemaImmutableError(
                f"archive '{spec.name}' was activated with another schema-relevant spec; "
                "an activated "
                "archive's columns, source, alignment, zone, start and aggregations are frozen. "
                f"Declare a new archive (e.g. '{spec.name}_v2') or delete this one first."
            )

    # -- compute -----------------------------------------------------------------------------

    def partials(
        self,
        spark: SparkSession,
        spec: RollupSpec,
        buckets: list[Window],
        entities: frozenset[str] | None,
    ) -> tuple[DataFrame, dict[str, int]]:
        """The partial aggregates of `buckets` (for `entities`), and the source versions read."""
        source = self.catalog.archive(spec.source)
        spans = merge_windows(buckets)
        if isinstance(source, RollupSpec):
            snap = self.rollups.snapshot(source)
            rows = self.rollups.read_spark(spark, source, spans, entities, snapshot=snap)
            versions = {source.name: _v(snap.version), source.genmap_name: _v(snap.genmap_version)}
        else:
            rows, version = self.raw.read_spark(spark, source, spans, entities)
            versions = {source.name: _v(version)}
        targets = spark.createDataFrame(
            pa.table(
                {
                    "bucket_start": pa.array([w.start for w in buckets], TS),
                    "bucket_end": pa.array([w.end for w in buckets], TS),
                }
            )
        )
        return rollup_partials(rows, targets, spec, source), versions


def _v(version: int | None) -> int:
    return -1 if version is None else version
