"""The public Python API: everything a script, a notebook or another project needs, in one place.

    from rollup_assets.api import Engine, Settings, Warehouse, load_catalog, query_arrow

    settings = Settings.from_env()  # a script is an edge: it reads the environment, once
    engine = Engine(load_catalog(settings.specs), Warehouse(settings.warehouse))
    daily = query_arrow(engine, "energy_daily", entities=["meter-0007"])

It holds what the guides in `docs/` use: the engine over one warehouse and its specs; the
configuration (`Settings`, which a script reads from the environment as the CLI does); ingest;
reads; operations; export, import, backup and restore; Spark; metrics; sample readings to try
it on (`day_batch`, the demo's generator); the Dagster face for another project or a
definitions module of one's own; errors. Importing this module reads no environment and starts
nothing; the Dagster names (`RollupChain`, `build_definitions`, `WarehouseResource`,
`RawArchives`) load Dagster only when first used.
"""

from typing import TYPE_CHECKING, Any

from rollup_assets.demo.sample_data import day_batch
from rollup_assets.metrics import configure as configure_metrics
from rollup_assets.model.errors import (
    ArchiveActivationFailedError,
    ArchiveNotActivatedError,
    ArchiveNotFoundError,
    ArchiveSchemaImmutableError,
    AsOfUnavailableError,
    BackupError,
    BackupInvalidError,
    BackupSpecMismatchError,
    DeltaJarsMissingError,
    DeltaSparkMissingError,
    FenceMovedError,
    IngestValidationError,
    InvalidAggregationError,
    InvalidArchiveOperationError,
    InvalidArchiveStateTransitionError,
    InvalidStepError,
    InvalidTimeRangeError,
    InvalidTimeZoneError,
    RawRowsRetainedError,
    RecomputeAbortedError,
    RollbackRefusedError,
    RollupsError,
    RollupSourceInUseError,
    RollupSourceMissingError,
    RowNotFoundError,
    SpecError,
    TargetNotEmptyError,
    TenantError,
    UnsupportedTableFeatureError,
)
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.progress import Progress
from rollup_assets.model.spec_loader import load_catalog, parse_catalog
from rollup_assets.model.specs import Catalog, RawArchiveSpec, RollupSpec, TimeRangeArchiveSpec
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.spark import build_session
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.archive_io import export_archive, import_archive
from rollup_assets.services.backup import backup, restore
from rollup_assets.services.downsample import downsample, downsample_arrow, downsample_spark
from rollup_assets.services.engine import Engine
from rollup_assets.services.held import held_writes
from rollup_assets.services.ingest import delete_rows, ingest, ingest_file, ingest_with_spark
from rollup_assets.services.lineage import lineage
from rollup_assets.services.maintenance import maintain
from rollup_assets.services.operations import Operations
from rollup_assets.services.preview import preview_ingest
from rollup_assets.services.query import query_arrow, query_spark
from rollup_assets.services.realtime import realtime_arrow
from rollup_assets.services.rewind import rewind
from rollup_assets.services.rollback import rollback
from rollup_assets.services.surface import publish, publish_all
from rollup_assets.settings import MetricsConfig, Settings

if TYPE_CHECKING:
    from rollup_assets.assembly import build_definitions
    from rollup_assets.component import RollupChain
    from rollup_assets.orchestration.raw_archives import RawArchives
    from rollup_assets.orchestration.resources import WarehouseResource

# Names whose modules import Dagster, loaded on first use (PEP 562).
_DAGSTER_NAMES = {
    "RollupChain": "rollup_assets.component",
    "build_definitions": "rollup_assets.assembly",
    "WarehouseResource": "rollup_assets.orchestration.resources",
    "RawArchives": "rollup_assets.orchestration.raw_archives",
}


def __getattr__(name: str) -> Any:
    if name in _DAGSTER_NAMES:
        from importlib import import_module

        return getattr(import_module(_DAGSTER_NAMES[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArchiveActivationFailedError",
    "ArchiveNotActivatedError",
    "ArchiveNotFoundError",
    "ArchiveSchemaImmutableError",
    "AsOfUnavailableError",
    "BackupError",
    "BackupInvalidError",
    "BackupSpecMismatchError",
    "Catalog",
    "ChangeSource",
    "DeltaJarsMissingError",
    "DeltaSparkMissingError",
    "Engine",
    "FenceMovedError",
    "IngestResult",
    "IngestValidationError",
    "InvalidAggregationError",
    "InvalidArchiveOperationError",
    "InvalidArchiveStateTransitionError",
    "InvalidStepError",
    "InvalidTimeRangeError",
    "InvalidTimeZoneError",
    "MetricsConfig",
    "Operations",
    "Progress",
    "RawArchiveSpec",
    "RawArchives",
    "RawRowsRetainedError",
    "RecomputeAbortedError",
    "RollbackRefusedError",
    "RollupChain",
    "RollupSourceInUseError",
    "RollupSourceMissingError",
    "RollupSpec",
    "RollupsError",
    "RowNotFoundError",
    "Settings",
    "SpecError",
    "TargetNotEmptyError",
    "TenantError",
    "TimeRangeArchiveSpec",
    "UnsupportedTableFeatureError",
    "Warehouse",
    "WarehouseResource",
    "backup",
    "build_definitions",
    "build_session",
    "configure_metrics",
    "day_batch",
    "delete_rows",
    "downsample",
    "downsample_arrow",
    "downsample_spark",
    "export_archive",
    "held_writes",
    "import_archive",
    "ingest",
    "ingest_file",
    "ingest_with_spark",
    "lineage",
    "load_catalog",
    "maintain",
    "parse_catalog",
    "preview_ingest",
    "publish",
    "publish_all",
    "query_arrow",
    "query_spark",
    "realtime_arrow",
    "restore",
    "rewind",
    "rollback",
]
