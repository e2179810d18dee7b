"""KAI's ``minruntime``: running jobs protected from preempt and reclaim for a while after they start."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from shared.core import minruntime
from shared.core.builtin._arguments import number
from shared.core.plugins.priorities import KAI_PRIORITIES as KAI
from shared.core.plugins.registry import Plugin, PluginConfigError, PluginSpec

if TYPE_CHECKING:
    from shared.core.plugins.points import VictimAction
    from shared.core.policy import Argument, Policy
    from shared.core.session import Session
    from shared.core.tasks import JobState, TaskState

__all__ = ["SPEC"]

_RESOLVE_METHODS = ("lca",)
"""``reclaimResolveMethod`` values Kairos honours (KAI's ``queue`` is refused: Kairos resolves by lca)."""


class MinRuntime:
    """KAI minruntime: running jobs are protected from preempt / reclaim for a while after they start."""

    def __init__(self, preempt: float, reclaim: float) -> None:
        self.defaults: dict[VictimAction, float] = {"preempt": preempt, "reclaim": reclaim}

    def applies(self, ssn: Session, action: VictimAction) -> bool:
        if action == "preempt":
            return minruntime.preempt_enabled(ssn, self.defaults[action])
        return minruntime.reclaim_enabled(ssn, self.defaults[action])

    def keep(self, ssn: Session, action: VictimAction, attacker: JobState, victim: JobState) -> bool:
        return minruntime.victim_filter(ssn, action, attacker, victim, self.defaults[action])

    def validate(
        self,
        ssn: Session,
        action: VictimAction,
        attacker: JobState,
        victims: Iterable[tuple[JobState, Sequence[TaskState]]],
    ) -> bool:
        return minruntime.validator(ssn, action, attacker, victims, self.defaults[action])


def _min_runtime(arguments: Mapping[str, Argument], policy: Policy) -> Plugin[Session]:
    method = arguments.get("reclaimResolveMethod", "lca")
    if method not in _RESOLVE_METHODS:
        problem = f"resolve method {method!r}: Kairos resolves reclaim min-runtimes by lca only"
        raise PluginConfigError("minruntime", problem, "reclaimResolveMethod")
    preempt = _seconds(arguments, "defaultPreemptMinRuntime", policy.preempt_min_runtime)
    reclaim = _seconds(arguments, "defaultReclaimMinRuntime", policy.reclaim_min_runtime)
    return Plugin(victim_filter=MinRuntime(preempt, reclaim))


def _seconds(arguments: Mapping[str, Argument], key: str, default: float) -> float:
    value = number("minruntime", key, arguments.get(key, default))
    if not math.isfinite(value) or value < 0:
        raise PluginConfigError("minruntime", f"{value!r} seconds: expected a duration >= 0", key)
    return value


SPEC: PluginSpec[Session] = PluginSpec(
    "minruntime",
    _min_runtime,
    KAI["minruntime"],
    ("defaultPreemptMinRuntime", "defaultReclaimMinRuntime", "reclaimResolveMethod"),
)
