"""Copying Delta tables between filesystems, each at one version: what a backup and a restore move.

A table at version `v` is its `_delta_log` up to `v` (commits, checkpoints and compacted logs
no newer than `v`; `_last_checkpoint` only when it points at or before `v`, since a pointer past
`v` would make readers load a later state) plus the data files live at `v`. A copy with
`history` also takes the files the retained commits up to `v` added, removed or wrote as change
data (`_change_data/`), so the copy's change data feed answers for those versions as the
original's did; a file of an old commit that vacuum already deleted is skipped, as it could not
be read at the source either. Every path goes through pyarrow filesystems, so either side may be
a local directory or an object store.
"""

import json
import logging
import re
import urllib.parse
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.fs as pafs

from rollup_assets.model.errors import BackupError
from rollup_assets.resources.checksums import copy_with_sha256
from rollup_assets.resources.delta_tables import file_actions, open_table, read_commit
from rollup_assets.resources.warehouse import TABLE_FOLDERS, filesystem_for

log = logging.getLogger(__name__)
LOG_DIR = "_delta_log"
LAST_CHECKPOINT = f"{LOG_DIR}/_last_checkpoint"
# Log entries by the version they describe: commits, checksums, (multi-part and v2) checkpoints;
# compacted logs by the last version they cover. Names are matched whole (`fullmatch`) and
# versions are ASCII digits: `$` would accept a trailing newline, `\d` any Unicode digit.
_VERSIONED = re.compile(r"([0-9]{20})\.(json|crc|checkpoint\.[^/]+)")
_COMPACTED = re.compile(r"[0-9]{20}\.([0-9]{20})\.compacted\.json")
_COPY_THREADS = 8


@dataclass(frozen=True)
class TableFiles:
    """What a copy of a table at `version` needs, as paths relative to the table root.

    `log` is in the order to write it (commits before the checkpoints that summarize them,
    `_last_checkpoint` last); `data` must all exist; `history` is copied where it still exists.
    """

    version: int
    log: Sequence[str]
    data: Sequence[str]
    history: Sequence[str] = ()


def _log_order(name: str) -> tuple[int, int, str]:
    if name == LAST_CHECKPOINT:
        return (1 << 62, 0, name)
    base = name.rsplit("/", 1)[-1]
    m = _VERSIONED.fullmatch(base)
    if m:
        return (int(m.group(1)), 0 if m.group(2) == "json" else 1, name)
    m = _COMPACTED.fullmatch(base)
    return (int(m.group(1)) if m else -1, 2, name)


def log_files_until(fs: pafs.FileSystem, root: str, version: int) -> list[str]:
    """The `_delta_log` entries of the table at `root` that describe versions up to `version`."""
    selector = pafs.FileSelector(f"{root}/{LOG_DIR}", recursive=True)
    out = []
    for info in fs.get_file_info(selector):
        if info.type is not pafs.FileType.File:
            continue
        rel = info.path[len(root) + 1 :]
        name = info.base_name
        if rel.startswith(f"{LOG_DIR}/_sidecars/"):
            out.append(rel)  # v2 checkpoint parts: referenced by checkpoints, not by version
            continue
        if rel == LAST_CHECKPOINT:
            with fs.open_input_stream(info.path) as f:
                hint = json.loads(f.read().decode("utf-8"))
            if int(hint.get("version", version + 1)) <= version:
                out.append(rel)
            continue
        m = _VERSIONED.fullmatch(name) or _COMPACTED.fullmatch(name)
        if m and int(m.group(1)) <= version and "/" not in rel[len(LOG_DIR) + 1 :]:
            out.append(rel)
    return sorted(out, key=_log_order)


def _relative(table_uri: str, path: str) -> str:
    """A log path (relative, URI-encoded) as a path under the table root on its filesystem."""
    if "://" in path or path.startswith("/"):
        raise BackupError(
            f"table {table_uri} references a file outside its root ({path}); "
            "only self-contained tables can be copied"
        )
    return urllib.parse.unquote(path)


def files_at(
    uri: str,
    version: int,
    storage_options: dict[str, str] | None = None,
    *,
    history: bool = False,
) -> TableFiles:
    """The files of the table at `uri` as of `version` (see the module docstring)."""
    table = open_table(uri, storage_options, version)
    if table is None:
        raise BackupError(f"no Delta table at {uri}")
    if pa.table(table.deletion_vectors()).num_rows:
        raise BackupError(f"table {uri} v{version} has deletion vectors; they are not supported")
    fs, root = filesystem_for(uri, storage_options)
    log_files = log_files_until(fs, root, version)
    data = sorted({_relative(uri, f["path"]) for f in file_actions(table)})
    extra: set[str] = set()
    if history:
        live = set(data)
        for rel in log_files:
            m = _VERSIONED.fullmatch(rel.removeprefix(f"{LOG_DIR}/"))
            if not m or m.group(2) != "json":
                continue
            for action in read_commit(uri, int(m.group(1)), storage_options):
                for kind in ("add", "remove", "cdc"):
                    if kind in action:
                        extra.add(_relative(uri, action[kind]["path"]))
        extra -= live
    return TableFiles(version, log_files, data, sorted(extra))


@dataclass(frozen=True)
class Copied:
    files: int
    bytes: int
    skipped: int = 0  # optional files that no longer existed
    sha256: Mapping[str, str] = field(default_factory=dict)  # relative path -> of what was copied


def copy_files(
    source: tuple[pafs.FileSystem, str],
    target: tuple[pafs.FileSystem, str],
    paths: Iterable[str],
    *,
    optional: bool = False,
    ordered: bool = False,
) -> Copied:
    """Copy `paths` (relative) from under `source`'s root to the same paths under `target`'s,
    several at a time, or one after the other in the given order when `ordered`; the result
    holds the SHA-256 of each file copied, computed from the bytes copied.

    A missing source file raises BackupError, or is skipped when `optional`.
    """
    (src_fs, src_root), (dst_fs, dst_root) = source, target
    todo = list(paths)

    def one(rel: str) -> tuple[int, str] | None:
        src, dst = f"{src_root}/{rel}", f"{dst_root}/{rel}"
        info = src_fs.get_file_info(src)
        if info.type is not pafs.FileType.File:
            if optional:
                return None
            raise BackupError(f"{src} is missing; it was deleted while being copied?")
        dst_fs.create_dir(dst.rsplit("/", 1)[0], recursive=True)
        try:
            return copy_with_sha256((src_fs, src), (dst_fs, dst))
        except FileNotFoundError:
            if optional:
                return None
            raise BackupError(f"{src} disappeared while being copied") from None

    if ordered:
        done = [one(rel) for rel in todo]
    else:
        with ThreadPoolExecutor(max_workers=_COPY_THREADS, thread_name_prefix="copy") as pool:
            done = list(pool.map(one, todo))
    copied = {rel: d for rel, d in zip(todo, done, strict=True) if d is not None}
    return Copied(
        len(copied),
        sum(size for size, _ in copied.values()),
        len(todo) - len(copied),
        {rel: checksum for rel, (_, checksum) in copied.items()},
    )


def copy_table(
    uri: str,
    version: int,
    target: tuple[pafs.FileSystem, str],
    storage_options: dict[str, str] | None = None,
    *,
    history: bool = False,
) -> Copied:
    """Copy the table at `uri` as of `version` into `target` (filesystem, table root): data
    files first, then the log, so a reader of the target never sees a version without its
    files."""
    files = files_at(uri, version, storage_options, history=history)
    source = filesystem_for(uri, storage_options)
    data = copy_files(source, target, files.data)
    old = copy_files(source, target, files.history, optional=True)
    logged = copy_files(source, target, files.log, ordered=True)  # commits before later ones
    if old.skipped:
        log.info("%s: %d file(s) of old commits were already vacuumed", uri, old.skipped)
    return Copied(
        data.files + old.files + logged.files,
        data.bytes + old.bytes + logged.bytes,
        old.skipped,
        {**data.sha256, **old.sha256, **logged.sha256},
    )


def split_log(paths: Sequence[str]) -> tuple[list[str], list[str]]:
    """(data and change files, log entries in the order to write them) of a table's files."""
    data = sorted(p for p in paths if not p.startswith(f"{LOG_DIR}/"))
    log_files = sorted((p for p in paths if p.startswith(f"{LOG_DIR}/")), key=_log_order)
    return data, log_files


def list_files(fs: pafs.FileSystem, root: str) -> list[tuple[str, int]]:
    """Every file under `root` (relative path, size); empty if `root` does not exist."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return [
        (info.path[len(root) + 1 :], int(info.size or 0))
        for info in fs.get_file_info(selector)
        if info.type is pafs.FileType.File
    ]


def first_entry(fs: pafs.FileSystem, root: str) -> str | None:
    """The name of some entry directly under `root`, or None if it is empty or absent."""
    info = fs.get_file_info(root)
    if info.type is pafs.FileType.NotFound:
        return None
    if info.type is not pafs.FileType.Directory:
        return info.base_name
    entries = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
    return min((e.base_name for e in entries), default=None)


def table_paths(fs: pafs.FileSystem, root: str) -> list[str]:
    """The tables under a warehouse root, as paths relative to it (`raw/<archive>`, ...):
    every directory of `TABLE_FOLDERS` that has a `_delta_log`."""
    out = []
    for folder in TABLE_FOLDERS:
        selector = pafs.FileSelector(f"{root}/{folder}", allow_not_found=True)
        for info in fs.get_file_info(selector):
            if info.type is not pafs.FileType.Directory:
                continue
            if fs.get_file_info(f"{info.path}/{LOG_DIR}").type is pafs.FileType.Directory:
                out.append(f"{folder}/{info.base_name}")
    return sorted(out)
