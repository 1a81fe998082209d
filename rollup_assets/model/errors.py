"""Domain exceptions, one per failure a user can act on (after the reference's exception catalog).

Every message names the archive and, where there is one, the row or rule at fault.
"""

from datetime import datetime


class RollupsError(Exception):
    """Base class of every error this project raises on purpose."""


class SpecError(RollupsError):
    """A spec file breaks a rule; raised at load, before anything touches the warehouse."""

    def __init__(self, archive: str, rule: str, message: str) -> None:
        self.archive = archive
        self.rule = rule
        # A name with a control character (a newline, say) is shown escaped: the message stays
        # one line, and the character is visible.
        shown = archive if archive.isprintable() else repr(archive)[1:-1]
        super().__init__(f"spec '{shown}' violates rule [{rule}]: {message}")


class ArchiveNotFoundError(RollupsError):
    """The name does not resolve to a declared archive."""


class TenantError(RollupsError):
    """A tenant is unknown, missing where the spec declares tenants, or given where it declares
    none."""


class InvalidArchiveOperationError(RollupsError):
    """The operation does not apply to this kind of archive (e.g. ingest into a rollup)."""


class ArchiveNotActivatedError(RollupsError):
    """Ingest, query or recompute against an archive whose status is not Activated."""


class ArchiveSchemaImmutableError(RollupsError):
    """The spec of an activated archive changed in a schema-relevant way."""


class InvalidArchiveStateTransitionError(RollupsError):
    """A lifecycle or operator action is not allowed from the archive's current state."""


class RollupSourceInUseError(RollupsError):
    """Deleting an archive that activated rollups still read from."""


class RollupSourceMissingError(RollupsError):
    """Activating a rollup whose source archive is not activated."""


class IngestValidationError(RollupsError):
    """A batch failed pre-validation; nothing was written.

    `row` is the 0-based index of the first offending row in the input file (None when the
    problem is the file itself, e.g. a missing column).
    """

    def __init__(self, archive: str, row: int | None, reason: str) -> None:
        self.archive = archive
        self.row = row
        self.reason = reason
        where = f"row {row}" if row is not None else "batch"
        super().__init__(
            f"ingest into '{archive}' rejected at {where}: {reason}; nothing was written"
        )

    @classmethod
    def before_retention(
        cls, archive: str, row: int | None, reading: str, not_before: datetime
    ) -> "IngestValidationError":
        """A reading (`reading`: which, and when) before what retention keeps: its day was
        dropped, and its rollups keep their values (they would not be corrected)."""
        return cls(
            archive,
            row,
            f"{reading} is before {not_before.isoformat()}: retention has dropped those days",
        )


class UnsupportedTableFeatureError(RollupsError):
    """A Delta table uses a feature this project's readers do not apply (deletion vectors):
    reading its files as they are would give wrong rows, so nothing is read."""

    def __init__(self, table: str, feature: str, message: str) -> None:
        self.table = table
        self.feature = feature
        self.message = message
        super().__init__(f"'{table}' uses the Delta table feature `{feature}`: {message}")


class RawRowsRetainedError(RollupsError):
    """A recompute (or rewind, or rollback) needs rows that retention removed: raw rows of a
    first level's source, buckets of a rollup a level above reads, or the rollup's own dropped
    buckets; the stored buckets keep their values and nothing was written."""


class InvalidTimeRangeError(RollupsError):
    """A time or time range given by a user is unparseable, inverted or misaligned."""


class InvalidStepError(RollupsError):
    """A downsampling step is unparseable or does not nest the archive's buckets (a rollup's, or
    a time-range archive's declared period)."""


class InvalidAggregationError(RollupsError):
    """A query's `COLUMN:FUNCTION` names no column of the archive, no aggregate function, a
    function the column's type does not support, or is missing where the query needs one."""


class InvalidTimeZoneError(RollupsError):
    """A query's zone is not an IANA time zone, or not the zone a rollup's buckets are kept in."""


class RecomputeAbortedError(RollupsError):
    """A recompute stopped before its pointer flip; readers still see the previous values."""


class FenceMovedError(RollupsError):
    """An action that changes a rollup's pointers lost the race to another one (a rewind, a
    rollback, retention, a disable) that moved the pointer table's fence after this one read it:
    nothing was committed, and what it read may no longer hold."""


class BackupError(RollupsError):
    """A backup cannot be taken or restored; the message names what and where."""


class BackupInvalidError(BackupError):
    """The backup's manifest is missing or corrupt, or its files do not match it."""


class BackupSpecMismatchError(BackupError):
    """The backup's archives do not match the archives the spec file declares now."""


class TargetNotEmptyError(BackupError):
    """A backup or restore target (directory or warehouse root) already holds files."""


class RowNotFoundError(RollupsError):
    """No active row of a rollup for the bucket and entity asked about."""


class AsOfUnavailableError(RollupsError):
    """An as-of read asked for a time the table cannot show: before it existed, or older than
    what its retention still keeps."""


class RollbackRefusedError(RollupsError):
    """A rollback cannot restore exactly what the job replaced; nothing was changed."""


class ArchiveActivationFailedError(RollupsError):
    """Provisioning failed; the archive is now Failed and `activate` may be retried."""


class ColumnChangeError(InvalidArchiveOperationError):
    """A computed-column change that does not apply (nothing pending, or a column others read)."""


class WarmSparkError(RollupsError):
    """The warm Spark server could not be managed (the reason names what and where)."""


class DeltaJarsMissingError(RollupsError):
    """A Spark session should load Delta's jars, but one is missing from its directory."""


class DeltaSparkMissingError(RollupsError):
    """The session given to a Spark ingest does not load Delta."""


class DemoError(RollupsError):
    """The demo cannot run as asked (e.g. its directories hold data it did not write)."""
