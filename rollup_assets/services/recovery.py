"""Finishing what interrupted operator actions left: the one place that reads their intents.

An action of several commits records its intent before its first effect (`model.intents`; a
rollback records a Swapping `Rollback` job instead). Whoever finds one finishes it from what its
effects show: the same command run again (on its own archive, at once), `rollups maintain` and
the retroactive-write sensor (every archive, once the intent is older than
`model.intents.STALE_AFTER`, so a live process is left to finish its own).
"""

import logging
from datetime import UTC, datetime

from rollup_assets.model.intents import STALE_AFTER, Intent, IntentKind
from rollup_assets.model.jobs import JobState, Trigger
from rollup_assets.model.specs import RollupSpec
from rollup_assets.services.columns import finish_column_change, source_spec
from rollup_assets.services.engine import Engine
from rollup_assets.services.rewind import finish_rewind
from rollup_assets.services.rollback import recover_rollback

log = logging.getLogger(__name__)


def finish_intent(engine: Engine, name: str, intent: Intent, *, actor: str) -> None:
    """Finish the action `intent` describes on archive `name`."""
    if intent.kind is IntentKind.REWIND:
        finish_rewind(engine, engine.catalog.rollup(name), intent, actor=actor)
    else:
        finish_column_change(engine, source_spec(engine, name), intent, actor=actor)


def finish_interrupted(engine: Engine, name: str, *, actor: str) -> str | None:
    """Finish the action an interrupted process left on archive `name`, however recent: what
    was finished, or None when nothing was left."""
    intent = Intent.decode(engine.states.get(name).intent)
    if intent is None:
        return None
    finish_intent(engine, name, intent, actor=actor)
    return f"{name}: finished the interrupted {intent.describe()}"


def recover(engine: Engine, *, actor: str, now: datetime | None = None) -> list[str]:
    """Finish every stale intent and interrupted rollback of the warehouse: what was done."""
    now = now or datetime.now(UTC)
    notes = []
    for name, state in engine.states.all().items():
        intent = Intent.decode(state.intent)
        if intent is None or not intent.stale(now) or name not in engine.catalog.names():
            continue
        try:
            finish_intent(engine, name, intent, actor=actor)
            notes.append(f"{name}: finished the interrupted {intent.describe()}")
        except Exception as exc:  # one archive's leftover must not keep the others'
            log.exception("finishing the interrupted %s of %s failed", intent.kind.value, name)
            notes.append(f"{name}: finishing the interrupted {intent.describe()} failed: {exc}")
    for job in engine.ledger.snapshot().jobs.values():
        if job.trigger is not Trigger.ROLLBACK or job.state is not JobState.SWAPPING:
            continue
        if now - (job.started_at or job.created_at) <= STALE_AFTER:
            continue
        spec = engine.catalog.archive(job.rollup)
        if not isinstance(spec, RollupSpec):
            continue
        outcome = recover_rollback(engine, spec, job, why="found unfinished by recovery")
        notes.append(
            f"{job.rollup}: interrupted rollback {job.job_id} of job {job.undoes} "
            + ("completed: its pointer commit had landed" if outcome else "failed: it never landed")
        )
    return notes
