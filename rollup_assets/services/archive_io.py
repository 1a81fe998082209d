"""Moving one archive's rows: export its logical rows to Parquet, import raw rows from one.

An export is what `query` returns for the archive (a rollup's logical columns, a raw or
time-range archive's rows), read from one snapshot, in one Parquet file whose key-value metadata
carries the manifest (`model/manifests.py`: archive, kind, columns, range, entities, row count,
source versions, export time) and, under `CHECKSUM_KEY`, the file's own SHA-256
(`rollup_assets/resources/checksums.py`). An import loads such a file (or any file `ingest` accepts)
into a raw or time-range archive with the ingest semantics: validated whole, upserted in one commit,
detected by the sensors like any other write. Rollup rows are derived from their source, so they
are never imported: import the source's rows and the rollups follow.

An exported file is checked before its rows are read: its row count, then its checksum, which
its manifest announces, so a file changed after the export (in place, or rewritten, which drops
the checksum) is refused. A file exported by a release before checksums has none and is
imported after a warning, its row count checked only; a file without a manifest is any file.
"""

import logging
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from rollup_assets.model.errors import IngestValidationError, InvalidArchiveOperationError
from rollup_assets.model.jobs import ChangeSource
from rollup_assets.model.manifests import EXPORT_CHECKSUM, ExportManifest
from rollup_assets.model.progress import Progress
from rollup_assets.model.specs import schema_fingerprint
from rollup_assets.resources.checksums import (
    parquet_checksum_matches,
    parquet_placeholder,
    seal_parquet,
)
from rollup_assets.resources.raw_ingest import IngestResult
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.ingest import ingest_file
from rollup_assets.services.query import query_versions

log = logging.getLogger(__name__)
MANIFEST_KEY = b"rollups.export"
CHECKSUM_KEY = b"rollups.export.sha256"
# Rows per row group of an exported file: each is written, and reported, on its own.
EXPORT_ROW_GROUP = 262_144


def _filesystem(file: str) -> tuple[pafs.FileSystem, str]:
    """A local path or a URI of a file: its filesystem and the path inside it."""
    parent, _, name = file.rstrip("/").rpartition("/")
    fs, root = Warehouse(parent or ".").filesystem()
    return fs, f"{root}/{name}"


def export_archive(
    engine: Engine,
    archive: str,
    file: str,
    start: datetime | None = None,
    end: datetime | None = None,
    entities: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> ExportManifest:
    """Write the archive's rows in [start, end) (of `entities`) to the Parquet `file`;
    `progress(pass, rows)` hears of the rows read, then of each row group written."""
    spec = engine.catalog.archive(archive)
    if progress is not None:
        progress("reading", 0)
    rows, versions = query_versions(engine, archive, start, end, entities)
    if progress is not None:
        progress("reading", rows.num_rows)
    manifest = ExportManifest(
        archive=archive,
        kind=spec.kind.value,
        columns=tuple(rows.column_names),
        rows=rows.num_rows,
        start=start,
        end=end,
        entities=tuple(sorted(entities)) if entities else None,
        source_versions=versions,
        exported_at=datetime.now(UTC),
        fingerprint=schema_fingerprint(spec),
        checksum=EXPORT_CHECKSUM,
    )
    meta = {**(rows.schema.metadata or {}), MANIFEST_KEY: manifest.to_json().encode("utf-8")}
    rows = rows.replace_schema_metadata(meta)
    # Written and sealed locally (the checksum goes into the finished footer), then copied.
    with tempfile.TemporaryDirectory(prefix="rollups-export-") as tmp:
        local = str(Path(tmp) / "export.parquet")
        placeholder = parquet_placeholder()
        with pq.ParquetWriter(local, rows.schema) as writer:
            if progress is not None:
                progress("writing", 0, rows.num_rows)
            for offset in range(0, rows.num_rows, EXPORT_ROW_GROUP):
                group = rows.slice(offset, EXPORT_ROW_GROUP)
                writer.write_table(group)
                if progress is not None:
                    progress("writing", offset + group.num_rows, rows.num_rows)
            writer.add_key_value_metadata({CHECKSUM_KEY: placeholder})
        seal_parquet(local, placeholder)
        fs, path = _filesystem(file)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        pafs.copy_files(local, path, destination_filesystem=fs)
    return manifest


def read_export_manifest(archive: str, path: str | Path) -> ExportManifest | None:
    """The manifest of an exported file (None: a file not written by export)."""
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError):
        return None  # not Parquet (e.g. CSV): the ingest reports what is wrong with it
    text = meta.get(MANIFEST_KEY)
    if text is None:
        return None
    try:
        return ExportManifest.from_json(text.decode("utf-8"))
    except ValueError as exc:
        raise IngestValidationError(
            archive, None, f"its export manifest is corrupt ({exc})"
        ) from None


@dataclass(frozen=True)
class ImportResult:
    ingest: IngestResult
    manifest: ExportManifest | None  # of the file, when export wrote it


def import_archive(engine: Engine, archive: str, file: str) -> ImportResult:
    """Load an exported (or any ingestable) file into a raw or time-range archive."""
    with tempfile.TemporaryDirectory(prefix="rollups-import-") as tmp:
        local = file
        if "://" in file:  # an object-store file: the ingest reads a local copy
            fs, path = _filesystem(file)
            local = str(Path(tmp) / Path(path).name)
            pafs.copy_files(path, local, source_filesystem=fs)
        manifest = read_export_manifest(archive, local)
        if manifest is not None:
            _check(archive, local, manifest)
            local = _without_computed(engine, archive, local, Path(tmp))
        result = ingest_file(engine, archive, local, ChangeSource.IMPORT)
    return ImportResult(result, manifest)


def _without_computed(engine: Engine, archive: str, path: str, tmp: Path) -> str:
    """An export holds the archive's computed columns too; they are derived, like rollup rows,
    and computed again by the ingest, so a copy without them is what gets imported."""
    spec = engine.catalog.archive(archive)
    computed = {c.name for c in getattr(spec, "computed_columns", ())}
    names = pq.read_schema(path).names
    if not computed & set(names):
        return path
    out = str(tmp / f"supplied-{Path(path).name}")
    pq.write_table(pq.read_table(path, columns=[n for n in names if n not in computed]), out)
    return out


def _check(archive: str, path: str, manifest: ExportManifest) -> None:
    if manifest.is_rollup:
        raise InvalidArchiveOperationError(
            f"{Path(path).name} holds rows of the rollup '{manifest.archive}'; rollup rows are "
            "derived from their source and are not imported: import the source archive's rows "
            "and let the rollups follow"
        )
    name = Path(path).name
    rows = pq.read_metadata(path).num_rows
    if rows != manifest.rows:
        raise IngestValidationError(
            archive,
            None,
            f"{name} holds {rows} rows but its export manifest says {manifest.rows}; "
            "the file was changed after the export",
        )
    if not manifest.checksum:
        log.warning(
            "%s was exported by an older release and has no checksum; its rows are imported "
            "with its row count checked only",
            name,
        )
        return
    if manifest.checksum != EXPORT_CHECKSUM:
        raise IngestValidationError(
            archive,
            None,
            f"{name}: its export manifest names an unknown checksum {manifest.checksum!r}",
        )
    matches = parquet_checksum_matches(path, CHECKSUM_KEY)
    if matches is None:
        raise IngestValidationError(
            archive,
            None,
            f"{name} has lost the checksum its export manifest announces; the file was "
            "rewritten after the export",
        )
    if not matches:
        raise IngestValidationError(
            archive,
            None,
            f"{name} does not match the checksum its export recorded; the file was changed "
            "after the export",
        )
