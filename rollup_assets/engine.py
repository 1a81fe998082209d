"""The shared machinery of every rollup run: stores, state, and computing partials from a source.

`Engine` is deliberately free of Dagster: the assets, the CLI and the tests all drive it.
"""

import logging
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from resources.control import ArchiveState, ArchiveStateStore, ArchiveStatus
from resources.delta_store import RollupStore
from resources.ledger import ChangeKind, Job, Ledger, Trigger
from resources.raw_store import RawStore
from resources.warehouse import Warehouse
from rollup_assets.aggregation import rollup_partials
from rollup_assets.errors import ArchiveNotActivatedError, ArchiveSchemaImmutableError
from rollup_assets.partitions import Bucketing, Window, first_bucket_start, merge_windows
from rollup_assets.specs import ArchiveSpec, Catalog, RollupSpec, schema_fingerprint

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

    # -- windows -----------------------------------------------------------------------------

    def buckets_in(self, spec: RollupSpec, spans: list[Window]) -> list[Window]:
        """The rollup's buckets covering `spans`, never before its first partition."""
        b = Bucketing.of(spec)
        first = first_bucket_start(spec)
        out: set[Window] = set()
        for span in merge_windows(spans):
            out.update(w for w in b.windows(max(span.start, first), span.end) if w.start >= first)
        return sorted(out)

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

    # -- chain propagation -------------------------------------------------------------------

    def propagation_jobs(
        self,
        spec: RollupSpec,
        buckets: list[Window],
        entities: frozenset[str] | None,
        version: int | None,
        states: dict[str, ArchiveState] | None = None,
    ) -> list[Job]:
        """Pending jobs for direct dependents whose already-consumed buckets contain `buckets`."""
        states = states if states is not None else self.states.all()
        jobs = []
        for dep in self.catalog.dependents(spec.name):
            state = states.get(dep.name) or ArchiveState(dep.name)
            consumed = state.consumed_until
            if consumed is None or state.status in (ArchiveStatus.CREATED, ArchiveStatus.DELETED):
                continue
            touched = [w for w in buckets if w.start < consumed]
            if not touched:
                continue
            dep_buckets = [w for w in self.buckets_in(dep, touched) if w.start < consumed]
            if dep_buckets:
                jobs.append(
                    Job(
                        rollup=dep.name,
                        trigger=Trigger.CHAIN,
                        windows=tuple(dep_buckets),
                        entities=entities,
                        source_archive=spec.name,
                        source_version=version,
                        change_kind=ChangeKind.RETROACTIVE_MODIFY,
                    )
                )
        return jobs


def _v(version: int | None) -> int:
    return -1 if version is None else version


def utcnow() -> datetime:
    return datetime.now(UTC)
