"""Backing up a whole warehouse at one consistent set of versions, and restoring it.

What a backup holds: every table of the warehouse (raw and time-range archives, rollups, their
pointer tables, the archive states and the ledger) copied at one version each
(`rollup_assets/resources/delta_copy.py`), under `tables/<path under the root>`, and
`manifest.json`, written last, naming each table's version, what was copied (each file with the
SHA-256 of the bytes copied), and the archives the specs declared.

Which versions: the ones a reader would have seen at one instant. They are found without
clocks by reading twice: every table's latest version is read (a rollup's row table together
with its pointers, as `RollupStore.snapshot` pairs them for readers), then every table is
checked for a newer commit (and the set of tables for a new one). When nothing moved, each table
sat at its version from its first read to its check, so all of them did at the moment between
the two passes: the copy is the warehouse as it was at that instant, control tables included,
as if the system had stopped there. A warehouse that keeps moving is read again, a bounded number
of times.

Why nothing is lost after a restore: the system already recovers from a stop at any point
(invariant 3), and a stop at one instant is what a backup records. Raw commits after a recorded
change-detection cursor are detected again; a pending or running job in the ledger is run
again, and a recompute of cells whose stored values are already right rewrites nothing; a
completed job's pointers are in the pointer table at that same instant. The raw tables are
copied with the files of their older commits, so the change data feed answers for the versions
the rollups' lineage and the cursors refer to. Only the runs of a Dagster instance are not in
the warehouse: restore into a Dagster home that has not run against the original warehouse, so
no run key of the original's runs is taken already.

A restore writes into an empty root only, and checks everything before it writes: the manifest,
that its archives are declared now with the same kind and schema, that the backup's files are
exactly those listed, and that each has the SHA-256 the manifest records (so a file altered in
place, at the same size, is refused by name); the files are read once to verify and once to copy,
and the copy is checked against the manifest again. A manifest of an older release, without
checksums, is refused: take a new backup, or restore it with the release that made it.

It copies every table's data files, then the logs, the archive states last: until that table
exists every archive reads as not activated, so no sensor or ingest acts on a half-restored
warehouse. Each rollup's surface is copied like any table and then published
(`services.surface`): a backup taken between a flip and its publish holds a surface one step
behind, which the publish brings up to date.
"""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime

import pyarrow.fs as pafs

from rollup_assets.model.errors import (
    BackupError,
    BackupInvalidError,
    BackupSpecMismatchError,
    TargetNotEmptyError,
)
from rollup_assets.model.manifests import (
    MANIFEST_NAME,
    BackupManifest,
    TableEntry,
    declared_archives,
)
from rollup_assets.model.progress import Progress
from rollup_assets.resources.checksums import sha256_of_files
from rollup_assets.resources.delta_copy import (
    copy_files,
    copy_table,
    first_entry,
    list_files,
    split_log,
    table_paths,
)
from rollup_assets.resources.delta_tables import open_table
from rollup_assets.resources.latest_versions import committed_after
from rollup_assets.resources.warehouse import Warehouse
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import publish_all

TABLES = "tables"  # where a backup keeps the tables, under the same paths as the warehouse
STATES_TABLE = "_control/archives"  # restored last: it activates the archives
READ_ATTEMPTS = 20


def _relative(warehouse: Warehouse, uri: str) -> str:
    return uri[len(warehouse.root) + 1 :]


def _observe(engine: Engine, paths: Sequence[str]) -> dict[str, int]:
    """The latest version of each table in `paths` (absent ones left out)."""
    wh, options = engine.warehouse, engine.warehouse.storage_options
    versions: dict[str, int] = {}
    for spec in engine.catalog.rollups.values():
        path = _relative(wh, engine.rollups.uri(spec))
        if path not in paths:
            continue
        snap = engine.rollups.snapshot(spec)
        if snap.version is not None:
            versions[path] = snap.version
        if snap.genmap_version is not None:
            versions[_relative(wh, engine.rollups.genmap_uri(spec))] = snap.genmap_version
    for path in paths:
        if path not in versions:
            table = open_table(wh.join(path), options)
            if table is not None:
                versions[path] = table.version()
    return versions


def consistent_versions(engine: Engine, attempts: int = READ_ATTEMPTS) -> dict[str, int]:
    """Table path -> version: every table of the warehouse as it was at one instant."""
    wh = engine.warehouse
    fs, root = wh.filesystem()
    for _ in range(attempts):
        paths = table_paths(fs, root)
        versions = _observe(engine, paths)
        moved = table_paths(fs, root) != paths or any(
            committed_after(wh.join(p), versions.get(p), wh.storage_options) for p in paths
        )
        if not moved:
            return versions
    raise BackupError(
        f"warehouse {wh.root} kept changing while its table versions were read "
        f"({attempts} attempts); try again when it is quieter"
    )


def backup(engine: Engine, target: str, progress: Progress | None = None) -> BackupManifest:
    """Copy every table of the warehouse at one consistent set of versions into the empty
    directory `target` (a local path or a URI) and write its manifest; `progress` hears of
    each table copied."""
    out = Warehouse(target)
    fs, root = out.filesystem()
    entry = first_entry(fs, root)
    if entry is not None:
        raise TargetNotEmptyError(
            f"backup directory {out.root} is not empty (it holds '{entry}'); "
            "back up into a new or empty directory"
        )
    versions = consistent_versions(engine)
    tables = []
    for path, version in sorted(versions.items()):
        copied = copy_table(
            engine.warehouse.join(path),
            version,
            (fs, f"{root}/{TABLES}/{path}"),
            engine.warehouse.storage_options,
            history=path.startswith("raw/"),  # sources: their change data feed is read
        )
        tables.append(TableEntry(path, version, copied.files, copied.bytes, copied.sha256))
        if progress is not None:
            progress("copying", len(tables))
    manifest = BackupManifest(
        created_at=datetime.now(UTC),
        source_root=engine.warehouse.root,
        specs_origin=engine.catalog.origin,
        archives=declared_archives(engine.catalog),
        tables=tables,
    )
    with fs.open_output_stream(f"{root}/{MANIFEST_NAME}") as f:
        f.write(manifest.to_json().encode("utf-8"))
    return manifest


def read_manifest(source: str) -> BackupManifest:
    """The manifest of the backup at `source`; BackupInvalidError if missing or corrupt."""
    backup_dir = Warehouse(source)
    fs, root = backup_dir.filesystem()
    where = f"{backup_dir.root}/{MANIFEST_NAME}"
    if fs.get_file_info(f"{root}/{MANIFEST_NAME}").type is not pafs.FileType.File:
        raise BackupInvalidError(
            f"no {MANIFEST_NAME} in {backup_dir.root}: not a backup, or one that did not finish"
        )
    with fs.open_input_stream(f"{root}/{MANIFEST_NAME}") as f:
        raw = f.read()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BackupInvalidError(f"backup manifest {where} is corrupt: not UTF-8") from None
    return BackupManifest.from_json(text, where)


def _check_checksums(
    backup_root: str,
    table: str,
    expected: Mapping[str, str],
    found: Mapping[str, str],
    then: str,
) -> None:
    """BackupInvalidError naming the first file of `table` whose SHA-256 is not the manifest's;
    `then` ends the message (what was, or was not, written)."""
    for path in sorted(expected):
        if found.get(path) != expected[path]:
            raise BackupInvalidError(
                f"backup {backup_root}: file {path} of table {table} does not match its "
                f"checksum in the manifest (SHA-256 {str(found.get(path))[:12]}..., recorded "
                f"{expected[path][:12]}...); the backup was changed or damaged{then}"
            )


def restore(engine: Engine, source: str, progress: Progress | None = None) -> BackupManifest:
    """Rebuild the (empty) warehouse of `engine` from the backup at `source`; `progress` hears
    of each table whose files are verified, then whose data files, then whose log, is copied."""
    manifest = read_manifest(source)
    backup_dir = Warehouse(source)
    problems = manifest.mismatches(engine.catalog)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BackupSpecMismatchError(
            f"backup {backup_dir.root} does not match the specs: {problems[0]}{more}"
        )
    dst_fs, dst_root = engine.warehouse.filesystem()
    entry = first_entry(dst_fs, dst_root)
    if entry is not None:
        raise TargetNotEmptyError(
            f"warehouse {engine.warehouse.root} is not empty (it holds '{entry}'); "
            "restore into a new or empty warehouse root"
        )
    src_fs, src_root = backup_dir.filesystem()
    plans: dict[str, tuple[list[str], list[str]]] = {}
    for t in manifest.tables:
        files = list_files(src_fs, f"{src_root}/{TABLES}/{t.path}")
        size = sum(s for _, s in files)
        if (len(files), size) != (t.files, t.bytes):
            raise BackupInvalidError(
                f"backup {backup_dir.root}: table {t.path} holds {len(files)} file(s) of "
                f"{size} bytes, its manifest says {t.files} of {t.bytes}; the backup is "
                "incomplete or was changed"
            )
        unlisted = sorted({p for p, _ in files} - set(t.sha256))
        if unlisted:
            raise BackupInvalidError(
                f"backup {backup_dir.root}: table {t.path} holds {unlisted[0]}, a file its "
                "manifest does not list; the backup was changed"
            )
        plans[t.path] = split_log([p for p, _ in files])
    checksums = {t.path: t.sha256 for t in manifest.tables}
    for done, t in enumerate(manifest.tables, 1):
        computed = sha256_of_files(src_fs, f"{src_root}/{TABLES}/{t.path}", sorted(t.sha256))
        _check_checksums(backup_dir.root, t.path, t.sha256, computed, "; nothing was restored")
        if progress is not None:
            progress("verifying", done)

    def copy(path: str, files: list[str], ordered: bool = False) -> None:
        src = (src_fs, f"{src_root}/{TABLES}/{path}")
        copied = copy_files(src, (dst_fs, f"{dst_root}/{path}"), files, ordered=ordered)
        # The bytes copied are hashed too: a file that changed since it was verified is caught.
        _check_checksums(
            backup_dir.root,
            path,
            {f: checksums[path][f] for f in files},
            copied.sha256,
            f" while it was restored; delete {engine.warehouse.root} and restore again",
        )

    for done, (path, (data, _)) in enumerate(plans.items(), 1):
        copy(path, data)
        if progress is not None:
            progress("copying data of", done)
    for done, path in enumerate(sorted(plans, key=lambda p: p == STATES_TABLE), 1):
        copy(path, plans[path][1], ordered=path == STATES_TABLE)
        if progress is not None:
            progress("copying logs of", done)
    for t in manifest.tables:
        table = open_table(engine.warehouse.join(t.path), engine.warehouse.storage_options)
        found = None if table is None else table.version()
        if found != t.version:
            raise BackupInvalidError(
                f"restored table {engine.warehouse.join(t.path)} is at version {found}, "
                f"the backup's manifest says {t.version}"
            )
    publish_all(engine)
    return manifest
