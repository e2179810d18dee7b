"""What a SchedulingShard in force asks that Kairos does not apply, as users see it
(`services.state.controllers.shard_notes`): one Warning naming every field with its reason, and the condition
FullyApplied=False carrying the same message, patched together with Accepted; nothing when the status
already says it."""

from __future__ import annotations

import pytest

from services.state.controllers.shard_notes import (
    FULLY_APPLIED,
    SETTINGS_NOT_APPLIED,
    conditions_patch,
    notes_problem,
    shows,
)
from services.state.mirror.problems import ACCEPTED
from shared.kube import wire
from shared.kube.scheduling_shard import NotApplied

NOTES = (
    NotApplied(field="spec.goMemLimitRatio", reason="a Go runtime setting"),
    NotApplied(field="spec.scenarioSearchBudgets", reason="no wall-clock budget"),
)
NOW = 1_700_000_000.0


def cond(kind: str, status: str, reason: str = "", message: str = "") -> wire.Condition:
    return wire.Condition(type=kind, status=status, reason=reason, message=message, last_transition_time="t")


def test_the_warning_names_the_shard_and_every_field_with_its_reason() -> None:
    problem = notes_problem("pool-a", NOTES)
    assert problem is not None
    assert (problem.kind, problem.name, problem.reason) == ("SchedulingShard", "pool-a", SETTINGS_NOT_APPLIED)
    assert problem.message.startswith("SchedulingShard 'pool-a'")
    assert "spec.goMemLimitRatio: a Go runtime setting; spec.scenarioSearchBudgets: no wall-clock budget" in (
        problem.message
    )
    assert notes_problem("pool-a", ()) is None


def shown(patch: dict[str, object] | None) -> dict[str, tuple[str, str]]:
    assert patch is not None
    conditions = patch["status"]["conditions"]  # type: ignore[index]
    return {c["type"]: (c["status"], c.get("message", "")) for c in conditions}  # type: ignore[union-attr]


PROBLEM = notes_problem("pool-a", NOTES)
assert PROBLEM is not None


@pytest.mark.parametrize(
    ("conditions", "notes", "expected"),
    [
        pytest.param([], PROBLEM, {FULLY_APPLIED: ("False", PROBLEM.message)}, id="first told"),
        pytest.param(
            [cond(ACCEPTED, "True", ACCEPTED)], None, None, id="nothing to tell, nothing told before"
        ),
        pytest.param(
            [cond(FULLY_APPLIED, "False", SETTINGS_NOT_APPLIED, PROBLEM.message)],
            PROBLEM,
            None,
            id="already shown",
        ),
        pytest.param(
            [cond(FULLY_APPLIED, "False", SETTINGS_NOT_APPLIED, "older")],
            PROBLEM,
            {FULLY_APPLIED: ("False", PROBLEM.message)},
            id="other notes now",
        ),
        pytest.param(
            [cond(FULLY_APPLIED, "False", SETTINGS_NOT_APPLIED, PROBLEM.message)],
            None,
            {FULLY_APPLIED: ("True", "")},
            id="the fields removed",
        ),
        pytest.param(
            [cond(ACCEPTED, "False", "InvalidSchedulingShard", "bad"), cond("Other", "True")],
            PROBLEM,
            {ACCEPTED: ("True", ""), "Other": ("True", ""), FULLY_APPLIED: ("False", PROBLEM.message)},
            id="fixed and noted in one patch, other conditions kept",
        ),
        pytest.param(
            [cond(ACCEPTED, "False", "InvalidSchedulingShard", "bad")],
            None,
            {ACCEPTED: ("True", "")},
            id="fixed with nothing to note",
        ),
    ],
)
def test_one_status_patch_sets_accepted_and_fully_applied_together(
    conditions: list[wire.Condition], notes: object, expected: dict[str, tuple[str, str]] | None
) -> None:
    patch = conditions_patch(conditions, notes, NOW)  # type: ignore[arg-type]
    if expected is None:
        assert patch is None
    else:
        assert shown(patch) == expected


def test_a_status_that_already_tells_the_notes_means_no_second_event() -> None:
    assert shows([cond(FULLY_APPLIED, "False", SETTINGS_NOT_APPLIED, PROBLEM.message)], PROBLEM)
    assert not shows([cond(FULLY_APPLIED, "False", SETTINGS_NOT_APPLIED, "older")], PROBLEM)
    assert not shows([], PROBLEM)
