"""Rewind: move a rollup's watermark back, so the forward lane aggregates the range again.

Destructive: every recompute of the range is dropped (its pointers and its rows of a generation
above 0); until the forward lane has aggregated the range again, readers see the generation-0
rows it wrote when it first closed those buckets.

A rewind takes three commits, in this order, after recording its intent (`model.intents`):

1. the archive state: the intent, the watermark at the target and no forward claim, in one
   compare-and-set. A recompute placing its buckets from now on leaves the range alone;
2. the pointer table: the pointers of buckets at/after the target go, in one commit that moves
   the rollup's fence. A recompute that placed its buckets before (and read the fence before)
   can no longer flip there: it fails and is retried for its part before the target;
3. the row table: the rows of a generation above 0 at/after the target go.

Then the surface is published and the intent cleared. Steps 2 and 3 can run twice, so an
interrupted rewind is finished by running it again, by `rollups maintain`, or by the sensor.
"""

import logging
from dataclasses import replace
from datetime import UTC, datetime

from rollup_assets.faults import checkpoint
from rollup_assets.model.bucketing import Bucketing, first_bucket_start
from rollup_assets.model.errors import InvalidTimeRangeError
from rollup_assets.model.intents import Intent, IntentKind, require_no_intent
from rollup_assets.model.specs import RollupSpec
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import Window, as_utc, iso_utc, parse_instant
from rollup_assets.services.engine import Engine
from rollup_assets.services.surface import publish

log = logging.getLogger(__name__)


def rewind(engine: Engine, name: str, to: datetime, *, actor: str) -> tuple[ArchiveState, int]:
    """Rewind rollup `name` to bucket boundary `to` (see the module): the new state and the
    recomputed rows deleted. An interrupted earlier action on the rollup is finished first."""
    spec = engine.catalog.rollup(name)
    to = as_utc(to)
    left = Intent.decode(engine.states.get(name).intent)
    if left is not None and left.kind is IntentKind.REWIND:
        finish_rewind(engine, spec, left, actor=actor)
    state = engine.require_activated(spec)
    require_no_intent(name, state)
    if not Bucketing.of(spec).is_boundary(to) or to < first_bucket_start(spec):
        raise InvalidTimeRangeError(
            f"rewind target {to.isoformat()} is not a bucket boundary of '{name}' "
            "at or after its first partition"
        )
    if state.watermark is None or to > state.watermark:
        raise InvalidTimeRangeError(
            f"rewind moves the watermark back; {to.isoformat()} is after the current watermark "
            f"{state.watermark.isoformat() if state.watermark else 'none'}"
        )
    # The forward lane aggregates the rewound range again from its source.
    engine.require_source_rows(spec, [Window(to, state.watermark)])
    intent = Intent(IntentKind.REWIND, {"to": iso_utc(to)}, datetime.now(UTC), actor)

    def begin(s: ArchiveState) -> ArchiveState:
        require_no_intent(name, s)
        if s.watermark is None or to > s.watermark:
            raise InvalidTimeRangeError(
                f"'{name}' was rewound meanwhile, to before {to.isoformat()}; nothing was done"
            )
        return replace(s, watermark=to, claimed_until=None, intent=intent.encode())

    engine.states.update(name, begin, reason=f"rewind to {to.isoformat()} begins", actor=actor)
    checkpoint("rewind_intent", name)
    return finish_rewind(engine, spec, intent, actor=actor)


def finish_rewind(
    engine: Engine, spec: RollupSpec, intent: Intent, *, actor: str
) -> tuple[ArchiveState, int]:
    """Steps 2 and 3 of a rewind whose intent (and watermark) is recorded, then its end."""
    to = parse_instant(intent.what["to"], "rewind target")
    engine.rollups.drop_pointers_from(spec, to, job_id=f"rewind:{iso_utc(to)}")
    checkpoint("rewind_pointers", spec.name)
    deleted = engine.rollups.delete_recomputed_from(spec, to)
    checkpoint("rewind_rows", spec.name)
    publish(engine, spec)  # plain readers of the surface see the rewound rows too
    encoded = intent.encode()
    new = engine.states.update(
        spec.name,
        lambda s: replace(s, intent=None) if s.intent == encoded else None,
        reason=f"rewind to {to.isoformat()} (dropped {deleted} recomputed row(s))",
        actor=actor,
    )
    return new, deleted
