"""Run tags: what a run this project launches is for, written by the sensors and the CLI and
read by the asset body, the run lookup and the UI's filters.

A run without a `RunIntent` (launched from the UI's materialize button or a backfill) is a Manual
recompute of the selected partitions.
"""

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from rollup_assets.model.jobs import Lane, Trigger
from rollup_assets.model.windows import iso_utc, parse_instant

# What a person filters runs by in the UI: shown on every run.
TAG_ROLLUP = "rollups/rollup"
TAG_LANE = "rollups/lane"
TAG_TRIGGER = "rollups/trigger"
TAG_JOB = "rollups/job_id"
TAG_OPERATOR = "rollups/operator"
# The rollups whose surfaces a publish run brings up to date (comma-separated).
TAG_SURFACES = "rollups/surfaces"
# Bookkeeping the system reads back (a pinned clock, where a run's worker runs): hidden in the
# UI, which does not show tags under Dagster's hidden prefix.
HIDDEN_PREFIX = ".dagster/rollups."
TAG_NOW = f"{HIDDEN_PREFIX}now"
TAG_HOST = f"{HIDDEN_PREFIX}host"
TAG_PID = f"{HIDDEN_PREFIX}pid"
# The launcher's worker a run was handed to (`orchestration/launcher.py`): "<pid> <run id>".
TAG_WORKER = f"{HIDDEN_PREFIX}worker"
# The keys runs launched before the bookkeeping was hidden carry instead.
_SHOWN_BEFORE = {TAG_NOW: "rollups/now", TAG_HOST: "rollups/host", TAG_PID: "rollups/pid"}
TAG_TENANT = "rollups/tenant"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
RUN_KEY = "dagster/run_key"


def tag(tags: Mapping[str, str], key: str) -> str | None:
    """The value of `key` in a run's `tags`, under the key older runs used if need be."""
    value = tags.get(key)
    if value is None and key in _SHOWN_BEFORE:
        value = tags.get(_SHOWN_BEFORE[key])
    return value


def worker_tag(pid: int, run_id: str) -> str:
    """`TAG_WORKER`'s value for run `run_id` handed to the worker with `pid`."""
    return f"{pid} {run_id}"


def worker_pid(tags: Mapping[str, str], run_id: str) -> int | None:
    """The pid of the worker run `run_id` (of `tags`) was handed to; None when its tags name none
    or another run's (a re-executed run carries its parent's tags)."""
    pid, _, owner = tags.get(TAG_WORKER, "").partition(" ")
    return int(pid) if owner == run_id and pid.isdigit() else None


def partition_range_tags(start_key: str, end_key: str) -> dict[str, str]:
    return {RANGE_START: start_key, RANGE_END: end_key}


@dataclass(frozen=True)
class RunIntent:
    """Why a run writes its rollup: its lane, trigger, ledger job and pinned clock."""

    rollup: str
    lane: Lane = Lane.RECOMPUTE
    trigger: Trigger = Trigger.MANUAL
    job_id: str | None = None
    now: datetime | None = None  # the forward lane's clock, when the launcher pinned it
    host: str | None = None  # where the run worker runs, when known: tells a later tick it died

    def tags(self) -> dict[str, str]:
        tags = {TAG_ROLLUP: self.rollup, TAG_LANE: self.lane.value, TAG_TRIGGER: self.trigger.value}
        if self.job_id:
            tags[TAG_JOB] = self.job_id
        if self.now is not None:
            tags[TAG_NOW] = iso_utc(self.now)
        if self.host:
            tags[TAG_HOST] = self.host
        return tags

    @classmethod
    def from_tags(cls, tags: Mapping[str, str], rollup: str) -> "RunIntent":
        return cls(
            rollup=tags.get(TAG_ROLLUP, rollup),
            lane=Lane(tags.get(TAG_LANE, Lane.RECOMPUTE.value)),
            trigger=Trigger(tags.get(TAG_TRIGGER, Trigger.MANUAL.value)),
            job_id=tags.get(TAG_JOB) or None,
            now=parse_instant(now, TAG_NOW) if (now := tag(tags, TAG_NOW)) else None,
            host=tag(tags, TAG_HOST) or None,
        )
