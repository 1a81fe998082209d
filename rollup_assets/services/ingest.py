"""The ingest use case: a file of raw or time-range rows into an activated archive.

The archive must be a raw or time-range archive, activated with the spec it is declared with;
the file is validated whole and upserted in one commit (`RawStore.ingest`), or nothing is
written.
"""

from pathlib import Path

from resources.raw_store import IngestResult
from rollup_assets.model.errors import InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import RollupSpec
from rollup_assets.services.engine import Engine


def ingest_file(
    engine: Engine, archive: str, path: str | Path, change_source: ChangeSource
) -> IngestResult:
    spec = engine.catalog.archive(archive)
    if isinstance(spec, RollupSpec):
        raise InvalidArchiveOperationError(
            f"'{archive}' is a rollup; rollups are written by the system only"
        )
    engine.require_activated(spec)
    return engine.raw.ingest(spec, path, change_source)
