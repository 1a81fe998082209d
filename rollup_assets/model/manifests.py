"""The manifests of a warehouse backup and of an archive export: what they record, as JSON.

A backup manifest names every table of the warehouse with the Delta version it was copied at
(one consistent set of versions), the SHA-256 of every file copied, and the archives the spec
file declared then (kind and schema fingerprint), so a restore can refuse a warehouse the
current specs could not read, and a backup whose files changed. An export manifest describes
one Parquet file of an archive's logical rows: which archive, which rows (range, entities), how
many, the source versions they were read at, and how the file's checksum is kept.

Backups of format version 1 (from releases before checksums) are refused: nothing could vouch
for their files' content. An export without a checksum is imported after a warning (see
`services/archive_io.py`).
"""

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from rollup_assets.model.errors import BackupInvalidError
from rollup_assets.model.specs import ArchiveKind, Catalog, schema_fingerprint
from rollup_assets.model.windows import iso_utc

BACKUP_FORMAT = "rollups-backup"
EXPORT_FORMAT = "rollups-export"
BACKUP_FORMAT_VERSION = 2  # 2: every file's SHA-256
EXPORT_FORMAT_VERSION = 1
# How an export's checksum is kept: the SHA-256 of the file under this footer key
# (`rollup_assets/resources/checksums.py`); an export of an older release names none.
EXPORT_CHECKSUM = "sha256"
_SHA256 = re.compile(r"[0-9a-f]{64}")
MANIFEST_NAME = "manifest.json"
# Where a table may live under a warehouse root (see rollup_assets/resources/warehouse.py); a
# manifest naming anything else (an absolute path, `..`, a trailing newline) is refused before a
# restore writes a byte. Matched whole (`fullmatch`): `$` would also match before a trailing
# newline.
TABLE_PATH = re.compile(r"(raw|rollups|_control)/[A-Za-z0-9_][A-Za-z0-9_.-]*")


@dataclass(frozen=True)
class ArchiveEntry:
    kind: str
    fingerprint: str


@dataclass(frozen=True)
class TableEntry:
    """One table of a backup: its path under the root, the version copied, and what was copied
    (file count and bytes, log and data together, and each file's SHA-256 by its path under the
    table's root)."""

    path: str
    version: int
    files: int
    bytes: int
    sha256: Mapping[str, str]


def declared_archives(catalog: Catalog) -> dict[str, ArchiveEntry]:
    return {
        name: ArchiveEntry(
            catalog.archive(name).kind.value, schema_fingerprint(catalog.archive(name))
        )
        for name in catalog.names()
    }


@dataclass(frozen=True)
class BackupManifest:
    created_at: datetime
    source_root: str
    specs_origin: str
    archives: Mapping[str, ArchiveEntry]
    tables: Sequence[TableEntry]

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": BACKUP_FORMAT,
                "format_version": BACKUP_FORMAT_VERSION,
                "created_at": iso_utc(self.created_at),
                "source_root": self.source_root,
                "specs_origin": self.specs_origin,
                "archives": {
                    n: {"kind": a.kind, "fingerprint": a.fingerprint}
                    for n, a in sorted(self.archives.items())
                },
                "tables": [
                    {
                        "path": t.path,
                        "version": t.version,
                        "files": t.files,
                        "bytes": t.bytes,
                        "sha256": dict(sorted(t.sha256.items())),
                    }
                    for t in self.tables
                ],
            },
            indent=2,
        )

    @classmethod
    def from_json(cls, text: str, where: str) -> "BackupManifest":
        """Parse a manifest; BackupInvalidError (naming `where`) if it is not a valid one."""

        def bad(reason: str) -> BackupInvalidError:
            return BackupInvalidError(f"backup manifest {where} is corrupt: {reason}")

        try:
            doc = json.loads(text)
        except ValueError as exc:
            raise bad(f"not JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("format") != BACKUP_FORMAT:
            raise bad(f"not a {BACKUP_FORMAT} manifest")
        if doc.get("format_version") == 1:
            raise BackupInvalidError(
                f"backup manifest {where} was made by an older release: it records no "
                "checksums, so its files cannot be verified; take a new backup (or restore "
                "this one with the release that made it)"
            )
        if doc.get("format_version") != BACKUP_FORMAT_VERSION:
            raise bad(
                f"format version {doc.get('format_version')!r}; this release reads "
                f"version {BACKUP_FORMAT_VERSION}"
            )
        try:
            tables = [
                TableEntry(
                    str(t["path"]),
                    _whole(t["version"]),
                    _whole(t["files"]),
                    _whole(t["bytes"]),
                    {str(p): str(c) for p, c in t["sha256"].items()},
                )
                for t in doc["tables"]
            ]
            archives = {
                str(n): ArchiveEntry(str(a["kind"]), str(a["fingerprint"]))
                for n, a in doc["archives"].items()
            }
            manifest = cls(
                created_at=datetime.fromisoformat(doc["created_at"].replace("Z", "+00:00")),
                source_root=str(doc["source_root"]),
                specs_origin=str(doc["specs_origin"]),
                archives=archives,
                tables=tables,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise bad(f"missing or malformed field ({exc!r})") from None
        for t in tables:
            if not TABLE_PATH.fullmatch(t.path):
                raise bad(f"table path {t.path!r} is not a warehouse table path")
            if t.version < 0 or t.files < 1 or t.bytes < 0:
                raise bad(f"table {t.path}: version {t.version}, {t.files} file(s)")
            if len(t.sha256) != t.files:
                raise bad(f"table {t.path}: {t.files} file(s) but {len(t.sha256)} checksum(s)")
            for path, checksum in t.sha256.items():
                if not _SHA256.fullmatch(checksum):
                    raise bad(f"table {t.path}: file {path!r} has no SHA-256 ({checksum!r})")
        if len({t.path for t in tables}) != len(tables):
            raise bad("a table is listed twice")
        return manifest

    def mismatches(self, catalog: Catalog) -> list[str]:
        """Why the current specs could not read this backup: each archive of the backup must be
        declared now, with the same kind and schema-relevant spec."""
        now = declared_archives(catalog)
        out = []
        for name, was in sorted(self.archives.items()):
            current = now.get(name)
            if current is None:
                out.append(f"archive '{name}' of the backup is not declared in {catalog.origin}")
            elif current.kind != was.kind:
                out.append(
                    f"archive '{name}' is a {was.kind} archive in the backup but a "
                    f"{current.kind} archive in {catalog.origin}"
                )
            elif current.fingerprint != was.fingerprint:
                out.append(
                    f"archive '{name}' has another schema-relevant spec in {catalog.origin} "
                    f"than in the backup (backup: {was.fingerprint}; now: {current.fingerprint})"
                )
        return out


@dataclass(frozen=True)
class ExportManifest:
    """What an export file holds. Times are UTC instants; `start`/`end` None means unbounded."""

    archive: str
    kind: str
    columns: Sequence[str]
    rows: int
    start: datetime | None
    end: datetime | None
    entities: Sequence[str] | None
    source_versions: Mapping[str, int]
    exported_at: datetime
    fingerprint: str = ""
    checksum: str = ""  # EXPORT_CHECKSUM, or "" for an export of an older release

    @property
    def is_rollup(self) -> bool:
        return self.kind == ArchiveKind.ROLLUP.value

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": EXPORT_FORMAT,
                "format_version": EXPORT_FORMAT_VERSION,
                "archive": self.archive,
                "kind": self.kind,
                "fingerprint": self.fingerprint,
                "columns": list(self.columns),
                "rows": self.rows,
                "from": None if self.start is None else iso_utc(self.start),
                "to": None if self.end is None else iso_utc(self.end),
                "entities": None if self.entities is None else list(self.entities),
                "source_versions": dict(self.source_versions),
                "exported_at": iso_utc(self.exported_at),
                "checksum": self.checksum,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> "ExportManifest":
        """Parse an export manifest; ValueError with the reason if it is not a valid one."""
        doc = json.loads(text)
        if not isinstance(doc, dict) or doc.get("format") != EXPORT_FORMAT:
            raise ValueError(f"not a {EXPORT_FORMAT} manifest")
        if doc.get("format_version") != EXPORT_FORMAT_VERSION:
            raise ValueError(f"export format version {doc.get('format_version')!r}")

        def instant(key: str) -> datetime | None:
            text = doc.get(key)
            return None if text is None else datetime.fromisoformat(text.replace("Z", "+00:00"))

        try:
            exported_at = instant("exported_at")
            if exported_at is None:
                raise ValueError("no export time")
            return cls(
                archive=str(doc["archive"]),
                kind=str(doc["kind"]),
                columns=tuple(str(c) for c in doc["columns"]),
                rows=int(doc["rows"]),
                start=instant("from"),
                end=instant("to"),
                entities=None if doc.get("entities") is None else tuple(doc["entities"]),
                source_versions={str(k): int(v) for k, v in doc["source_versions"].items()},
                exported_at=exported_at,
                fingerprint=str(doc.get("fingerprint", "")),
                checksum=str(doc.get("checksum", "")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"missing or malformed field ({exc!r})") from None


def _whole(value: object) -> int:
    """A count or version of a manifest: a JSON whole number, not text or a boolean."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{value!r} is not a whole number")
    return value
