"""SHA-256 checksums of the files a backup or an export holds, so that a restore or an import
tells a file changed in place (same size, other bytes) from the one that was written.

A backup's manifest lists the checksum of every file it copied (`copy_with_sha256` computes it
from the bytes it copies). An export is one Parquet file that carries its own checksum in its
footer (`seal_parquet`): the SHA-256 of the whole file with 64 zeros where the checksum then
stands, so every byte but the checksum's own is covered, footer and manifest included.

These catch damage and edits; they are not signatures: whoever may rewrite a file may rewrite
its checksum too (see docs/security.md).
"""

import hashlib
import secrets
import struct
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import BinaryIO

import pyarrow.fs as pafs
import pyarrow.parquet as pq

CHUNK = 1 << 20
_THREADS = 8
_HEX = 64  # characters of a SHA-256 in hex
_ZEROS = b"0" * _HEX
_PARQUET_TAIL = 8  # a Parquet file ends with the footer's length (4 bytes) and b"PAR1"


def copy_with_sha256(
    source: tuple[pafs.FileSystem, str], target: tuple[pafs.FileSystem, str]
) -> tuple[int, str]:
    """Copy one file, byte for byte (no compression by extension); its size and SHA-256."""
    (src_fs, src), (dst_fs, dst) = source, target
    digest, size = hashlib.sha256(), 0
    with (
        src_fs.open_input_stream(src, compression=None) as inp,
        dst_fs.open_output_stream(dst, compression=None) as out,
    ):
        while chunk := inp.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def sha256_of_files(fs: pafs.FileSystem, root: str, paths: Iterable[str]) -> dict[str, str]:
    """The SHA-256 of each file in `paths` (relative to `root`), several read at a time."""

    def one(rel: str) -> str:
        digest = hashlib.sha256()
        with fs.open_input_stream(f"{root}/{rel}", compression=None) as inp:
            while chunk := inp.read(CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    todo = list(paths)
    with ThreadPoolExecutor(max_workers=_THREADS, thread_name_prefix="sha256") as pool:
        return dict(zip(todo, pool.map(one, todo), strict=True))


def parquet_placeholder() -> str:
    """A value to write under a Parquet file's checksum key before `seal_parquet`: random, so
    it occurs in the footer exactly there."""
    return secrets.token_hex(_HEX // 2)


def seal_parquet(path: str, placeholder: str) -> str:
    """Put the checksum of the local Parquet file at `path` where `placeholder` stands in its
    footer; returns the checksum."""
    with open(path, "r+b") as f:
        at = _footer_offset(f, placeholder.encode("ascii"))
        if at is None:
            raise ValueError(f"{path}: the checksum placeholder is not in the Parquet footer once")
        checksum = _sha256_with_zeros(f, at)
        f.seek(at)
        f.write(checksum.encode("ascii"))
    return checksum


def parquet_checksum_matches(path: str, key: bytes) -> bool | None:
    """Whether the local Parquet file at `path` matches the checksum its footer records under
    `key`; None when it records none."""
    recorded = (pq.read_metadata(path).metadata or {}).get(key)
    if recorded is None:
        return None
    with open(path, "rb") as f:
        at = _footer_offset(f, recorded)
        return (
            at is not None
            and len(recorded) == _HEX
            and _sha256_with_zeros(f, at) == (recorded.decode("ascii", "replace"))
        )


def _footer_offset(f: BinaryIO, needle: bytes) -> int | None:
    """Where `needle` stands in the footer of the Parquet file `f`, if it does exactly once."""
    size = f.seek(0, 2)
    if size < 2 * _PARQUET_TAIL:
        return None
    f.seek(size - _PARQUET_TAIL)
    (length,) = struct.unpack("<I", f.read(4))
    start = size - _PARQUET_TAIL - length
    if start < 0:
        return None
    f.seek(start)
    footer = f.read(length)
    if footer.count(needle) != 1:
        return None
    return start + footer.index(needle)


def _sha256_with_zeros(f: BinaryIO, at: int) -> str:
    """The SHA-256 of file `f` with 64 zeros in place of its bytes at `at`."""
    digest = hashlib.sha256()
    f.seek(0)
    remaining = at
    while remaining and (chunk := f.read(min(CHUNK, remaining))):
        digest.update(chunk)
        remaining -= len(chunk)
    digest.update(_ZEROS)
    f.seek(at + _HEX)
    while chunk := f.read(CHUNK):
        digest.update(chunk)
    return digest.hexdigest()
