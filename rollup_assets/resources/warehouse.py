"""Where tables live: the warehouse root (a local directory or an object-store URI).

Layout under the root:
    raw/<archive>/                 raw and time-range archives (Delta, CDF, by UTC day)
    rollups/<rollup>/              rollup rows at every generation (Delta)
    rollups/<rollup>__genmap/      the active-generation pointers of that rollup (Delta)
    rollups/<rollup>__active/      its active rows only, for plain Delta readers (Delta)
    _control/<table>/              archive state, ledger and job history (Delta)

With tenants declared in the spec, each tenant has a root of its own with that same layout:
the one its spec gives, else `<warehouse>/tenants/<tenant>/` (`tenant_warehouses`). Nothing
is written at the configured root itself then.
"""

import posixpath
import re
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.fs as pafs

from rollup_assets.model.errors import SpecError
from rollup_assets.model.specs import Catalog

TENANTS_DIR = "tenants"
# The folders of a root that hold tables (`raw_path`, `rollup_path`, `control_path`).
TABLE_FOLDERS = ("raw", "rollups", "_control")
# Schemes that reach the same store: Hadoop's S3 connectors (s3a, the retired s3n) read S3, and
# abfs is ABFS without TLS.
SAME_STORE = {"s3a": "s3", "s3n": "s3", "abfs": "abfss"}


def _is_uri(root: str) -> bool:
    return "://" in root


# Characters of a URI path kept literal when a root is brought to its percent-encoded form:
# sub-delims, ':' and '@' (abfss://container@account...); everything else non-ASCII is encoded.
URI_PATH_SAFE = "/:@!$&'()*+,;=~"


def canonical_uri(uri: str) -> str:
    """`uri` with its path percent-encoded exactly once, whether it was given encoded or raw.

    delta-rs and pyarrow parse URIs (pyarrow rejects a raw space or `ä`), while Hadoop takes a
    path string literally; one canonical, encoded spelling lets `spark_uri` decode it once.
    """
    scheme, rest = uri.split("://", 1)
    return f"{scheme}://{urllib.parse.quote(urllib.parse.unquote(rest), safe=URI_PATH_SAFE)}"


def _file_uri_path(uri: str) -> str:
    """The local path of a `file:` URI; a raw `#` or `?` is part of the name, not a fragment."""
    rest = uri.removeprefix("file:")
    if rest.startswith("//"):
        host, _, tail = rest[2:].partition("/")
        if host not in ("", "localhost"):
            raise ValueError(f"warehouse root {uri!r}: a file URI must name a local path")
        rest = "/" + tail
    return urllib.parse.unquote(rest)


@dataclass(frozen=True)
class Warehouse:
    """A warehouse root plus the delta-rs storage options needed to reach it."""

    root: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        root = self.root
        scheme, sep, rest = root.partition(":")
        if sep and (_is_uri(root) or scheme.lower() == "file"):
            root = f"{scheme.lower()}:{rest}"  # a scheme is case-insensitive: S3://, FILE:/
        if root.startswith("file:"):
            # A file URI stays a URI (file:/x, file:///x, encoded or not), so it takes the same
            # path through delta-rs, pyarrow and Hadoop as an object-store root does.
            root = Path(_file_uri_path(root)).resolve().as_uri()
        elif _is_uri(root):
            root = canonical_uri(root)
        else:
            root = str(Path(root).expanduser().resolve())
        object.__setattr__(self, "root", root.rstrip("/") or "/")

    @property
    def is_local(self) -> bool:
        """A local directory (given as a path or a `file:` URI)."""
        return not _is_uri(self.root) or self.root.startswith("file:")

    @property
    def location(self) -> str:
        """Where the root is, spelled one way, for telling whether two roots overlap: a local
        directory as its absolute path (given as a path or a `file:` URI); an object-store URI
        with the scheme of its store (`s3a://` and `s3n://` are `s3://`), the bucket or account
        in lower case, and the path decoded without `.`, `..` or repeated slashes."""
        if self.is_local:
            return _file_uri_path(self.root) if _is_uri(self.root) else self.root
        scheme, rest = self.root.split("://", 1)
        authority, _, path = rest.partition("/")
        path = posixpath.normpath(re.sub("/+", "/", "/" + urllib.parse.unquote(path)))
        return f"{SAME_STORE.get(scheme, scheme)}://{authority.lower()}{path}".rstrip("/")

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def raw_path(self, archive: str) -> str:
        return self.join("raw", archive)

    def rollup_path(self, rollup: str) -> str:
        return self.join("rollups", rollup)

    def genmap_path(self, rollup: str) -> str:
        return self.join("rollups", f"{rollup}__genmap")

    def surface_path(self, rollup: str) -> str:
        """The rollup's active rows for plain Delta readers (`services/surface.py`)."""
        return self.join("rollups", f"{rollup}__active")

    def control_path(self, table: str) -> str:
        return self.join("_control", table)

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """A pyarrow filesystem and the root path inside it."""
        return filesystem_for(self.root, self.storage_options)

    def drop_table(self, uri: str) -> None:
        """Delete the table at `uri` (a path under this root), files and log, if it exists."""
        fs, path = filesystem_for(uri, self.storage_options)
        if fs.get_file_info(path).type is not pafs.FileType.NotFound:
            fs.delete_dir(path)


def tenant_warehouses(base: Warehouse, catalog: Catalog) -> dict[str, Warehouse]:
    """Each declared tenant's warehouse: the root its spec gives, else `<base>/tenants/<name>`,
    with `base`'s storage options.

    Refuses roots that overlap, since a tenant could then reach another's tables: two tenants'
    roots at one place or one inside the other, and a tenant's root at or around `base`, or
    inside `base`'s own tables. Roots are compared by `Warehouse.location`, so `/p` and
    `file:///p`, `s3://b/t` and `s3a://b/t`, or a relative path and its absolute one are the
    same place. The error names the tenant declared later, the other one, and both roots."""
    out = {
        name: Warehouse(
            tenant.warehouse or base.join(TENANTS_DIR, name), dict(base.storage_options)
        )
        for name, tenant in catalog.tenants.items()
    }
    names = list(out)
    for i, name in enumerate(names):
        wh = out[name]
        clash = None
        # At or around the configured root is refused; inside it is where default roots go.
        if _within(base.location, wh.location):
            clash = _overlap(wh, base, "the configured warehouse")
        for folder in TABLE_FOLDERS:
            tables = Warehouse(base.join(folder))
            if clash is None and _within(wh.location, tables.location):
                clash = f"lies inside the configured warehouse's tables ({tables.root})"
        for other in names[:i]:
            clash = clash or _overlap(wh, out[other], f"tenant '{other}'s warehouse")
        if clash is not None:
            raise SpecError(
                f"tenants.{name}",
                "separate tenant warehouses",
                f"its warehouse {wh.root} {clash}; give each tenant a root of its own, "
                "apart from the others' and from the configured warehouse's tables",
            )
    return out


def _within(inner: str, outer: str) -> bool:
    """Location `inner` is `outer` or below it."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _overlap(wh: Warehouse, other: Warehouse, what: str) -> str | None:
    """How `wh` overlaps `other` (called `what`), as the end of a sentence; None if apart."""
    here, there = wh.location, other.location
    same = "" if wh.root == other.root else f"; both are {here}"
    if here == there:
        return f"is {what} ({other.root}{same})"
    if _within(there, here):
        return f"holds {what} ({other.root})"
    if _within(here, there):
        return f"lies inside {what} ({other.root})"
    return None


def tenant_warehouse(base: Warehouse, catalog: Catalog, tenant: str | None) -> Warehouse:
    """The warehouse a command for `tenant` works in (`base` itself when the spec declares no
    tenants); the tenant must be declared iff the spec declares tenants."""
    if catalog.tenant(tenant) is None:
        return base
    assert tenant is not None
    return tenant_warehouses(base, catalog)[tenant]


def filesystem_for(
    root: str, storage_options: dict[str, str] | None = None
) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem for a local path or URI, and the (decoded) path inside it.

    Executors write data files through it, so it must reach the store with the same credentials
    delta-rs uses: S3 and Azure storage options are mapped to pyarrow's; GCS (and any option
    not mapped) relies on the environment, e.g. GOOGLE_APPLICATION_CREDENTIALS, AWS_PROFILE.
    """
    if not _is_uri(root):
        return pafs.LocalFileSystem(), root
    opts = {k.lower(): v for k, v in (storage_options or {}).items()}
    scheme = root.split("://", 1)[0].lower()
    path = urllib.parse.unquote(root.split("://", 1)[1])
    if scheme in ("s3", "s3a") and opts:
        endpoint = _option(opts, "aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint")
        fs: pafs.FileSystem = pafs.S3FileSystem(
            access_key=_option(opts, "aws_access_key_id", "access_key_id"),
            secret_key=_option(opts, "aws_secret_access_key", "secret_access_key"),
            session_token=_option(opts, "aws_session_token", "session_token", "token"),
            region=_option(opts, "aws_region", "region", "aws_default_region"),
            endpoint_override=endpoint,
            scheme="http" if endpoint and endpoint.startswith("http://") else "https",
        )
        return fs, path
    if scheme in ("abfs", "abfss", "az", "adl", "azure") and opts:
        _, path = pafs.FileSystem.from_uri(root)  # container/path, account from the host
        account = (
            _option(opts, "azure_storage_account_name", "account_name")
            or (urllib.parse.urlparse(root).hostname or "").split(".", 1)[0]
        )
        fs = pafs.AzureFileSystem(
            account,
            account_key=_option(
                opts, "azure_storage_account_key", "azure_storage_access_key", "account_key"
            ),
            sas_token=_option(
                opts, "azure_storage_sas_key", "azure_storage_sas_token", "sas_token"
            ),
            client_id=_option(opts, "azure_storage_client_id", "azure_client_id", "client_id"),
            client_secret=_option(
                opts, "azure_storage_client_secret", "azure_client_secret", "client_secret"
            ),
            tenant_id=_option(opts, "azure_storage_tenant_id", "azure_tenant_id", "tenant_id"),
        )
        return fs, path
    return pafs.FileSystem.from_uri(root.replace("s3a://", "s3://", 1))


def _option(opts: dict[str, str], *names: str) -> str | None:
    """The first of `names` set in delta-rs storage options (keys compared lower-case)."""
    return next((opts[n] for n in names if opts.get(n)), None)


def spark_uri(path: str) -> str:
    """A local path or canonical URI as Spark/Hadoop expects it.

    Hadoop takes a path string literally (it never percent-decodes: `a%20b` names a directory
    called `a%20b`), so a URI is decoded to the real names and a local path gets `file://`.
    """
    if not _is_uri(path):
        return "file://" + path
    scheme, rest = path.split("://", 1)
    return f"{scheme}://{urllib.parse.unquote(rest)}"


def data_file_uri(table_uri: str, add_path: str) -> str:
    """Where the file of a Delta add action lives, as `spark_uri` takes it.

    `add_path` is relative and URI-encoded (Delta protocol; a partition value `a b` is the
    directory `p=a%20b`, logged as `p=a%2520b`). Under a URI root it stays encoded, so
    `spark_uri` decodes root and file together exactly once; under a local path it is decoded.
    """
    if _is_uri(table_uri):
        return f"{table_uri}/{add_path}"
    return f"{table_uri}/{urllib.parse.unquote(add_path)}"
