"""Writing an activated raw or time-range archive: ingest a file, or delete rows.

The archive must be a raw or time-range archive, activated with the spec it is declared with.
An ingest validates the file whole and upserts it in one commit (`RawStore.ingest`), or writes
nothing. A delete is one commit too: a correction (the rollups drop what the rows contributed)
or retention (the rollups keep it).
"""

from pathlib import Path

from resources.raw_store import IngestResult, SourceSpec
from rollup_assets.model.errors import InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.windows import Window
from rollup_assets.services.engine import Engine


def _writable(engine: Engine, archive: str) -> SourceSpec:
    spec = engine.catalog.archive(archive)
    if isinstance(spec, RollupSpec):
        raise InvalidArchiveOperationError(
            f"'{archive}' is a rollup; rollups are written by the system only"
        )
    engine.require_activated(spec)
    return spec


def delete_rows(
    engine: Engine,
    archive: str,
    span: Window,
    entities: frozenset[str] | None,
    change_source: ChangeSource,
    *,
    retention: bool,
) -> tuple[int | None, int]:
    """Delete the archive's rows in `span` (of `entities`): (commit version or None, rows)."""
    spec = _writable(engine, archive)
    return engine.raw.delete_rows(spec, span, entities, change_source, retention=retention)


def ingest_file(
    engine: Engine, archive: str, path: str | Path, change_source: ChangeSource
) -> IngestResult:
    return engine.raw.ingest(_writable(engine, archive), path, change_source)
