"""Intents: what an operator action of several commits is about to do, recorded before it does it.

A rewind, a computed-column change or a retention pass changes more than one table, so it cannot
be one commit. Each records its intent in the archive's state first (one compare-and-set, which
also refuses a second action while one is under way), then makes its effects, each of which can
be made again without harm, and clears the intent last. A process that dies in between leaves
the intent: the next run of the same command, `rollups maintain`, or the sensor (once the intent
is older than `STALE_AFTER`) finishes it from where the effects show it stopped. A recompute
records its own intent in the ledger instead (Swapping before its flip), and so does a rollback.

Pure Python: instants are aware UTC `datetime`s.
"""

import json
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from rollup_assets.model.errors import InvalidArchiveStateTransitionError
from rollup_assets.model.states import ArchiveState
from rollup_assets.model.windows import iso_utc

# An intent older than this is taken for the leftover of a process that died: its action is
# finished by whoever finds it. Every step of an action can be made twice, so finishing one that
# is in fact still running wastes work at worst.
STALE_AFTER = timedelta(seconds=60)


class IntentKind(StrEnum):
    REWIND = "rewind"
    COLUMN = "column"
    RETENTION = "retention"


@dataclass(frozen=True)
class Intent:
    """One action under way on an archive: `what` it does (a rewind's target, a column change's
    column and action, the instant retention keeps from), when it began and who began it."""

    kind: IntentKind
    what: dict[str, str]
    began_at: datetime
    by: str = ""

    def encode(self) -> str:
        return json.dumps(
            {
                "kind": self.kind.value,
                "what": self.what,
                "began_at": iso_utc(self.began_at),
                "by": self.by,
            },
            sort_keys=True,
        )

    @classmethod
    def decode(cls, text: str | None) -> "Intent | None":
        if not text:
            return None
        data = json.loads(text)
        began = datetime.fromisoformat(data["began_at"].replace("Z", "+00:00"))
        return cls(IntentKind(data["kind"]), dict(data["what"]), began, data.get("by", ""))

    def stale(self, now: datetime) -> bool:
        return now - self.began_at > STALE_AFTER

    def describe(self) -> str:
        detail = ", ".join(f"{k} {v}" for k, v in sorted(self.what.items()))
        by = f" by {self.by}" if self.by else ""
        return f"{self.kind.value} ({detail}) begun at {iso_utc(self.began_at)}{by}, unfinished"


def require_no_intent(name: str, state: ArchiveState) -> None:
    """Refuse a second action of several commits while one is under way on archive `name`."""
    pending = Intent.decode(state.intent)
    if pending is not None:
        raise InvalidArchiveStateTransitionError(
            f"'{name}' has an action under way: {pending.describe()}; it is finished by "
            "running it again, by `rollups maintain`, or by the sensor within a minute"
        )
