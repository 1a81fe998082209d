"""How far a rollup's surface lags behind its active rows, told from Delta logs alone (no data
file is read, no Spark): what the surface publish sensor plans from, and what `rollups status`
and the asset's observations show.

The surface records the pointer and row versions whose active rows it holds (`reflected`). The
commits after them are read one by one, oldest first, until the first that changes which rows
are active: a pointer commit other than compaction, vacuum or checkpoints (a flip, a rewind, a
rollback, a fence move), or a row commit other than `NEUTRAL_OPERATIONS` (a forward write). Its
commit time starts the lag: the lag is the seconds since the oldest change the surface does not
show yet, 0 while it shows them all. Commits that leave the active rows as they are do not lag
it, but more than `NEUTRAL_SLACK` of them still call for a publish, so that queries keep reading
the surface (they trust it at most `MAX_NEUTRAL_COMMITS` commits behind).
"""

import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from deltalake.exceptions import DeltaError
from pyarrow.fs import FileType

from rollup_assets.model.operations import NO_DATA_OPERATIONS, operation_of
from rollup_assets.model.specs import RollupSpec
from rollup_assets.resources.delta_tables import commit_file, read_commit
from rollup_assets.resources.rollup_snapshots import Reflected
from rollup_assets.resources.warehouse import filesystem_for
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface_changes import NEUTRAL_OPERATIONS
from rollup_assets.services.surface_reads import MAX_NEUTRAL_COMMITS, surface_state

log = logging.getLogger(__name__)

# Neutral commits a surface may be behind before a publish records the newer versions: half of
# what a query trusts, so the publish lands before queries stop reading the surface.
NEUTRAL_SLACK = MAX_NEUTRAL_COMMITS // 2


@dataclass(frozen=True)
class SurfaceLag:
    """A rollup's surface against its tables' logs."""

    rollup: str
    # The versions the surface reflects (None: no surface, or one that never recorded them).
    recorded: Reflected | None
    # Commit time of the oldest commit that changes active rows the surface does not show (None:
    # it shows every change, or, with `unknown`, the log cannot tell).
    since: datetime | None
    # Commits after the recorded versions read before the first change (or the end of the log).
    behind: int = 0
    # The recorded versions are gone from the logs (a re-created rollup, an expired log, a
    # restore): what changed cannot be told, and a publish rebuilds the surface.
    unknown: bool = False

    @property
    def needs_publish(self) -> bool:
        return self.since is not None or self.unknown or self.behind > NEUTRAL_SLACK

    def seconds(self, now: datetime) -> float | None:
        """Seconds from the oldest unpublished change to `now` (0: none; None: unknown)."""
        if self.since is None:
            return None if self.unknown else 0.0
        return max(0.0, (now - self.since).total_seconds())


def surface_lag(engine: Engine, spec: RollupSpec) -> SurfaceLag:
    """How far the surface of `spec` lags: its log, then the rollup's logs after the versions it
    records (a rollup with no tables and no surface has nothing to publish: no lag)."""
    options = engine.warehouse.storage_options
    try:
        # Kept until the surface moves: a sensor asks every tick, and while nothing is
        # published that costs two file stats per rollup.
        state = surface_state(engine, spec)
        recorded = None if state is None else state.reflects
    except (OSError, DeltaError) as exc:
        log.warning("%s: surface log not readable (%s)", spec.name, exc)
        recorded = None
    start = recorded or Reflected(-1, -1)
    tables = [
        (engine.rollups.genmap_uri(spec), start.genmap, NO_DATA_OPERATIONS),
        (engine.rollups.uri(spec), start.rows, NEUTRAL_OPERATIONS),
    ]
    oldest: datetime | None = None
    behind = 0
    for uri, version, neutral in tables:
        found = _first_change(uri, version, neutral, options)
        if found is None:
            return SurfaceLag(spec.name, recorded, None, behind, unknown=True)
        at, read = found
        behind += read
        if at is not None and (oldest is None or at < oldest):
            oldest = at
    if recorded is None and oldest is None:
        return SurfaceLag(spec.name, None, None, behind)  # nothing written yet
    return SurfaceLag(spec.name, recorded, oldest, behind, unknown=recorded is None)


def _first_change(
    uri: str, version: int, neutral: frozenset[str], options: dict[str, str]
) -> tuple[datetime | None, int] | None:
    """(commit time of the first commit after `version` that is not `neutral`, or None when
    there is none; the commits read), reading at most `NEUTRAL_SLACK + 1`. None when the log
    no longer holds `version` (what came after it cannot be told)."""
    fs, root = filesystem_for(uri, options)
    if version >= 0 and fs.get_file_info(commit_file(root, version)).type == FileType.NotFound:
        return None
    read = 0
    for v in range(version + 1, version + NEUTRAL_SLACK + 2):
        try:
            actions = read_commit(uri, v, options)
        except FileNotFoundError:
            break
        read += 1
        info: dict = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        if operation_of(info) in neutral:
            continue
        millis = info.get("timestamp")
        if millis is None:
            millis = (fs.get_file_info(commit_file(root, v)).mtime_ns or 0) // 1_000_000
        return datetime.fromtimestamp(int(millis) / 1000, tz=UTC), read
    return None, read
