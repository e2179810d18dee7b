"""The core's entry point: `schedule(snapshot, now, policy) -> CycleResult`.

Public. Called by the placement worker (`services.placement.worker`), the in-process simulator
(`tools.sim`), the in-process benchmark (`tools.bench`) and the conformance runner (`tools.conformance`).
Builds a session from the snapshot (its plugin chains resolved from the policy and a registry), runs the
policy's actions in order, and returns the decisions and
what the cycle observed as values (`shared.core.result`): bind proposals (whole gangs, each pod with its
key and what it holds), evictions, pipelined pods, an explanation for every podgroup still pending, the
stale and last-start stamps, a status per podgroup, and on request the session view. Pure: no I/O, no
clock (time comes in as `now`).
"""

from __future__ import annotations

from collections.abc import Collection

from shared.core.builtin_plugins import SessionRegistry
from shared.core.cycle import ActionHook, collector_paused, result_of, run_session
from shared.core.policy import Policy
from shared.core.result import CycleResult
from shared.model import Snapshot

__all__ = ["ActionHook", "CycleResult", "schedule"]


def schedule(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    focus: frozenset[str] | None = None,
    *,
    around_action: ActionHook | None = None,
    want_view: bool = False,
    node_details: Collection[str] = (),
    registry: SessionRegistry | None = None,
) -> CycleResult:
    """One scheduling cycle over `snapshot` at `now`.

    `focus`: place only these podgroups (the rest of the cluster is still seen, as victims and as load;
    stale-gang eviction still covers every gang). `around_action`: each action runs inside
    `around_action(name)` (the shells' per-action timer and spans). `want_view`: the result carries the
    session view. `node_details`: podgroups whose status also counts the nodes that refused their pods,
    per reason (the placement spans; off by default because a large cluster refuses a pending gang on
    every node). `registry`: the plugins the policy's list names (`shared.core.builtin_plugins`; KAI's
    when None; the shells pass KAI's plus the third-party plugins they loaded at start-up)."""
    with collector_paused():  # a session's objects are freed in one pass when it ends (shared.core.cycle)
        return _cycle(snapshot, now, policy, focus, around_action, want_view, node_details, registry)


def _cycle(
    snapshot: Snapshot,
    now: float,
    policy: Policy,
    focus: frozenset[str] | None,
    around_action: ActionHook | None,
    want_view: bool,
    node_details: Collection[str],
    registry: SessionRegistry | None,
) -> CycleResult:
    # The session ends with this frame, before the collector's pass (`schedule`).
    ssn = run_session(snapshot, now, policy, focus, around_action, registry)
    try:
        return result_of(ssn, want_view=want_view, node_details=node_details)
    finally:
        ssn.close()
