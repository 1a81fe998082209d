"""Where tables live: the warehouse root (a local directory or an object-store URI).

Layout under the root:
    raw/<archive>/                 raw and time-range archives (Delta, CDF on, partitioned by UTC day)
    rollups/<rollup>/              rollup rows at every generation (Delta)
    rollups/<rollup>__genmap/      the active-generation pointers of that rollup (Delta)
    _control/<table>/              archive state, ledger and job history (Delta)
"""

import os
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

DEFAULT_ROOT = "./warehouse"


def warehouse_root_from_env() -> str:
    return os.environ.get("ROLLUPS_WAREHOUSE") or DEFAULT_ROOT


def _is_uri(root: str) -> bool:
    return "://" in root


@dataclass(frozen=True)
class Warehouse:
    """A warehouse root plus the delta-rs storage options needed to reach it."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        root = self.root
        if root.startswith("file://"):
            root = urllib.parse.unquote(urllib.parse.urlparse(root).path)
        if not _is_uri(root):
            root = str(Path(root).expanduser().resolve())
        object.__setattr__(self, "root", root.rstrip("/") or "/")

    @classmethod
    def from_env(cls) -> "Warehouse":
        return cls(warehouse_root_from_env())

    @property
    def is_local(self) -> bool:
        return not _is_uri(self.root)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def raw_path(self, archive: str) -> str:
        return self.join("raw", archive)

    def rollup_path(self, rollup: str) -> str:
        return self.join("rollups", rollup)

    def genmap_path(self, rollup: str) -> str:
        return self.join("rollups", f"{rollup}__genmap")

    def control_path(self, table: str) -> str:
        return self.join("_control", table)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the root path inside it."""
        return filesystem_for(self.root, self.storage_options)


def filesystem_for(
    root: str, storage_options: dict[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    if not _is_uri(root):
        return pafs.LocalFileSystem(), root
    opts = storage_options or {}
    scheme = root.split("://", 1)[0].lower()
    if scheme in ("s3", "s3a") and opts:
        fs = pafs.S3FileSystem(
            access_key=opts.get("AWS_ACCESS_KEY_ID") or opts.get("aws_access_key_id"),
            secret_key=opts.get("AWS_SECRET_ACCESS_KEY") or opts.get("aws_secret_access_key"),
            session_token=opts.get("AWS_SESSION_TOKEN") or opts.get("aws_session_token"),
            region=opts.get("AWS_REGION") or opts.get("aws_region"),
            endpoint_override=opts.get("AWS_ENDPOINT_URL") or opts.get("aws_endpoint_url"),
        )
        return fs, root.split("://", 1)[1]
    fs, path = pafs.FileSystem.from_uri(root.replace("s3a://", "s3://"))
    return fs, path


def spark_uri(path: str) -> str:
    """A path as Spark/Hadoop expects it: local paths become `file:` URIs (spaces kept literal)."""
    return path if _is_uri(path) else "file://" + path
