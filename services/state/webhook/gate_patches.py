"""Setting and lifting Kairos's scheduling gates on a pod: who gets a gate, and the JSON patches.

The webhook (`services.state.webhook.webhook`) asks `may_gate` and `declares_after` of a pod being created and
answers with `gate_patch`; the gate keepers (`services.state.controllers.gate_keepers`) lift a gate with
`ungate_patch`; the mirror (`services.state.mirror.cache`) lists the pods still carrying the stages' gate
(`is_gated`). The gates themselves are `shared.kube.scheduling_gates`. The helpers take the gate's name
(`GATE` by default); a pod may carry both, and `gate_patch` adds both in one patch. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from services.state.mirror.dependencies import AFTER_ANNOTATION
from shared.kube import keys, wire
from shared.kube.scheduling_gates import GATE


def may_gate(pod: wire.Pod, scheduler_name: str = keys.SCHEDULER_NAME, gate: str = GATE) -> bool:
    """The pod is one `gate` is for: ours, not yet on a node, not carrying `gate` already."""
    return pod.spec.scheduler_name == scheduler_name and not pod.spec.node_name and not is_gated(pod, gate)


def declares_after(annotation_sets: Iterable[dict[str, str]]) -> bool:
    """Any of the pod's, its PodGroup's or its owners' annotations says `kairos.io/after`."""
    return any(annotations.get(AFTER_ANNOTATION, "").strip() for annotations in annotation_sets)


def gate_patch(pod: wire.Pod, gates: Sequence[str] = (GATE,)) -> list[dict[str, Any]]:
    """JSON patch adding `gates` (in order) to a pod being created; empty when `gates` is."""
    values = [{"name": name} for name in gates]
    if not values:
        return []
    if pod.spec.scheduling_gates:
        return [{"op": "add", "path": "/spec/schedulingGates/-", "value": value} for value in values]
    return [{"op": "add", "path": "/spec/schedulingGates", "value": values}]


def ungate_patch(pod: wire.Pod, gate: str = GATE) -> list[dict[str, Any]] | None:
    """JSON patch removing `gate`, guarded by a test of what is removed (a concurrent change to the
    gates fails the patch instead of removing someone else's gate); None when the pod has no such gate."""
    for index, found in enumerate(pod.spec.scheduling_gates):
        if found.name == gate:
            path = f"/spec/schedulingGates/{index}"
            return [
                {"op": "test", "path": f"{path}/name", "value": gate},
                {"op": "remove", "path": path},
            ]
    return None


def is_gated(pod: wire.Pod, gate: str = GATE) -> bool:
    return any(g.name == gate for g in pod.spec.scheduling_gates)
