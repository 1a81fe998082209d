"""Moving data in and out: export and import one archive's rows, back up and restore the
warehouse."""

import click

from rollup_assets.cli.app import (
    FORMATS,
    echo_data,
    engine,
    handle_errors,
    main,
    selection_options,
    tenant_option,
    time_range,
)
from rollup_assets.cli.progress import QUIET
from rollup_assets.model.windows import iso_utc


@main.command()
@click.argument("archive")
@click.argument("file")
@selection_options
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def export(
    archive: str,
    file: str,
    start: str | None,
    end: str | None,
    entities: tuple[str, ...],
    fmt: str,
    quiet: bool,
) -> None:
    """Write the rows of ARCHIVE to the Parquet FILE (a path or URI), as `query` returns them.

    A rollup gives its logical columns, a raw or time-range archive its rows. The file's
    key-value metadata `rollups.export` holds the manifest: archive, kind, columns, range,
    entities, row count, the table versions read and the export time. On a terminal, a
    progress line counts the rows read, then written, and their rate.
    """
    from rollup_assets.cli.progress import Meter
    from rollup_assets.services.archive_io import export_archive

    a, b = time_range(start, end)
    meter = Meter(f"export {archive}", quiet=quiet)
    try:
        m = export_archive(engine(), archive, file, a, b, list(entities) or None, meter)
    finally:
        meter.close()
    row = {
        "archive": m.archive,
        "kind": m.kind,
        "file": file,
        "rows": m.rows,
        "from": None if m.start is None else iso_utc(m.start),
        "to": None if m.end is None else iso_utc(m.end),
        "source_versions": ", ".join(f"{k}@{v}" for k, v in m.source_versions.items()),
    }
    echo_data(row, fmt)


@main.command("import")
@click.argument("archive")
@click.argument("file")
@click.option("--format", "fmt", type=FORMATS, default="table")
@tenant_option
@handle_errors
def import_command(archive: str, file: str, fmt: str) -> None:
    """Load FILE (written by `export`, or any file `ingest` takes) into a raw or time-range
    ARCHIVE, as an ingest with change source Import: validated whole, one commit, detected by
    the sensors. Rollup rows are derived and are never imported: import their source's rows.
    An exported file whose row count or checksum no longer matches its manifest is refused.
    """
    from rollup_assets.services.archive_io import import_archive

    result = import_archive(engine(), archive, file)
    r = result.ingest
    row = {
        "archive": archive,
        "version": r.version,
        "rows": r.rows,
        "inserted": r.inserted,
        "updated": r.updated,
        "unchanged": r.unchanged,
        "exported_from": None if result.manifest is None else result.manifest.archive,
    }
    echo_data(row, fmt)


@main.command("backup")
@click.argument("directory", metavar="DIR")
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def backup_command(directory: str, fmt: str, quiet: bool) -> None:
    """Copy every table of the warehouse into the new or empty DIR (a path or URI).

    The tables are taken at the versions a reader saw at one instant, control tables (archive
    states, ledger and detection cursors) included; DIR/manifest.json, written last, lists them.
    The running system may keep working meanwhile.
    """
    from rollup_assets.cli.progress import Meter
    from rollup_assets.services.backup import backup

    meter = Meter(f"backup into {directory}", unit="tables", quiet=quiet)
    try:
        m = backup(engine(), directory, meter)
    finally:
        meter.close()
    rows = [
        {"table": t.path, "version": t.version, "files": t.files, "bytes": t.bytes}
        for t in m.tables
    ]
    echo_data(rows, fmt, ["table", "version", "files", "bytes"])
    if fmt == "table":
        click.echo(f"backed up {len(rows)} table(s) of {m.source_root} into {directory}")


@main.command("restore")
@click.argument("directory", metavar="DIR")
@click.option("--format", "fmt", type=FORMATS, default="table")
@QUIET
@tenant_option
@handle_errors
def restore_command(directory: str, fmt: str, quiet: bool) -> None:
    """Rebuild the empty warehouse (ROLLUPS_WAREHOUSE) from the backup in DIR.

    Refuses, writing nothing, a warehouse root that is not empty, a missing or corrupt
    manifest (or one of an older release, without checksums), a backup with missing, extra or
    changed files (each file's SHA-256 is checked), and archives the spec file does not declare
    the same way. Use a fresh DAGSTER_HOME with the restored warehouse.
    """
    from rollup_assets.cli.progress import Meter
    from rollup_assets.services.backup import restore

    meter = Meter(f"restore from {directory}", unit="tables", quiet=quiet)
    try:
        m = restore(engine(), directory, meter)
    finally:
        meter.close()
    rows = [{"table": t.path, "version": t.version, "files": t.files} for t in m.tables]
    echo_data(rows, fmt, ["table", "version", "files"])
    if fmt == "table":
        click.echo(f"restored {len(rows)} table(s) backed up at {iso_utc(m.created_at)}")
