"""What a SchedulingShard in force asks that Kairos does not apply, as its users see it; pure.

The shard watch (`services.state.controllers.shard_watch`) puts a valid SchedulingShard's `ShardRecord` in force, and
the record's ``config.not_applied`` lists the fields Kairos accepts but does not honour, each with the reason
(`shared.kube.scheduling_shard`: a usage database, scheduler flags without a switch, KAI v0.16-v0.17's
``scenarioSearchBudgets`` and ``goMemLimit*``, a bad value in one of those). Each distinct list is told once:
a Warning Event ``SettingsNotApplied`` on the SchedulingShard naming every field, and a condition
``FullyApplied=False`` with the same reason and message in its status (so a new owner, finding it there,
tells nobody twice); once the shard asks nothing Kairos leaves out, the condition is set back to True.

`conditions_patch` builds the one status patch of a shard in force: ``Accepted`` set back to True (after a
problem) and ``FullyApplied`` together, since a merge patch of ``status.conditions`` replaces the whole list.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from services.state.mirror.problems import ACCEPTED, Problem
from shared.kube import wire
from shared.kube.quantity import rfc3339
from shared.kube.scheduling_shard import NotApplied

__all__ = ["FULLY_APPLIED", "SETTINGS_NOT_APPLIED", "conditions_patch", "notes_problem", "shows"]

FULLY_APPLIED = "FullyApplied"
"""The condition type: False while the shard in force asks something Kairos does not apply."""
SETTINGS_NOT_APPLIED = "SettingsNotApplied"
"""The reason of the condition and of the Warning Event."""


def notes_problem(shard: str, notes: Sequence[NotApplied]) -> Problem | None:
    """The Warning to tell about `notes` (None when there are none): every field with its reason."""
    if not notes:
        return None
    listed = "; ".join(f"{note.field}: {note.reason}" for note in notes)
    return Problem(
        kind="SchedulingShard",
        namespace="",
        name=shard,
        reason=SETTINGS_NOT_APPLIED,
        message=f"SchedulingShard {shard!r} is in force without what Kairos does not apply: {listed}",
    )


def shows(conditions: Sequence[wire.Condition], problem: Problem) -> bool:
    """The shard's status already tells `problem` (an earlier owner told it: no second Event)."""
    return any(
        c.type == FULLY_APPLIED and c.status == "False" and c.message == problem.message for c in conditions
    )


def conditions_patch(
    conditions: Sequence[wire.Condition], notes: Problem | None, now: float
) -> dict[str, Any] | None:
    """A merge patch of a shard in force's ``status.conditions`` (other conditions kept): ``Accepted`` True,
    ``FullyApplied`` False with `notes` or True without; None when the status already says so (a shard
    that never had notes gets no ``FullyApplied`` condition)."""
    listed = [msgspec.to_builtins(c) for c in conditions]
    changed = False
    accepted = next((c for c in conditions if c.type == ACCEPTED), None)
    if accepted is not None and accepted.status != "True":
        listed = [c for c in listed if c["type"] != ACCEPTED]
        listed.append(
            {
                "type": ACCEPTED,
                "status": "True",
                "reason": ACCEPTED,
                "message": "",
                "lastTransitionTime": rfc3339(now),
            }
        )
        changed = True
    ours = next((c for c in conditions if c.type == FULLY_APPLIED), None)
    if notes is None:
        wanted = None if ours is None or ours.status == "True" else ("True", FULLY_APPLIED, "")
    elif ours is not None and (ours.status, ours.reason, ours.message) == (
        "False",
        notes.reason,
        notes.message,
    ):
        wanted = None
    else:
        wanted = ("False", notes.reason, notes.message)
    if wanted is not None:
        status, reason, message = wanted
        listed = [c for c in listed if c["type"] != FULLY_APPLIED]
        listed.append(
            {
                "type": FULLY_APPLIED,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": rfc3339(now),
            }
        )
        changed = True
    return {"status": {"conditions": listed}} if changed else None
