"""PodDisruptionBudgets as the API server's Eviction endpoint enforces them (policy/v1).

Called by `Cluster.evict` (POST pods/eviction) before it deletes the pod. In Kubernetes two parts meet
there: the disruption controller (kube-controller-manager, pkg/controller/disruption) keeps each budget's
status, and the eviction REST (kube-apiserver, pkg/registry/core/pod/storage/eviction.go) reads it and
refuses. kubesim runs no disruption controller: `refusal` counts the status the controller would write
from the cluster as it is at the eviction, then applies the eviction REST's rules to it:

- a pod that is Pending, Succeeded or Failed, or already being deleted, goes without a look at budgets;
- a budget selects the pods of its namespace its `spec.selector` matches (an empty selector every pod, a
  missing or invalid one none); a pod two budgets select cannot be evicted (500, the registry's own Status);
- healthy pods are the selected ones that are Ready and not being deleted; `minAvailable` as a number needs
  that many (expected pods: all selected); `maxUnavailable`, and `minAvailable` as a percentage, count
  against the summed scale (`spec.replicas`) of the pods' controllers (a ReplicaSet a Deployment controls:
  the Deployment's), percentages rounded up; a pod without a controller is not counted;
- disruptions allowed = healthy - desired healthy, and none while it is negative or no pod is expected;
- a pod that is not Ready may go while the budget has its healthy pods (`unhealthyPodEvictionPolicy`
  AlwaysAllow: always), without spending a disruption;
- otherwise an eviction while none is allowed is 429 TooManyRequests "Cannot evict pod as it would violate
  the pod's disruption budget." with a `DisruptionBudget` cause "The disruption budget NAME needs D healthy
  pods and has H currently".

Where the controller's sync would fail (a controller that is not found or has no scale, such as a Job, or
a percentage that does not parse), the budget is never processed: the eviction answers 429 with the cause
"The disruption budget NAME is still being processed by the server." and Retry-After 10, as the real one
does for a budget whose status lags its generation. Evictions take effect at once here (no graceful
termination), so the controller's record of disrupted pods that are still terminating is not needed:
the next count no longer sees the evicted pod. Pure: no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from tools.kubesim.errors import ApiError, too_many_requests
from tools.kubesim.objects import controller_of, is_ready, labels_of, meta
from tools.kubesim.selectors import label_selector_of

__all__ = [
    "DISRUPTION_BUDGET_CAUSE",
    "REFUSED",
    "BudgetStatus",
    "Lookup",
    "Unscalable",
    "budget_status",
    "refusal",
]

Obj = dict[str, Any]

REFUSED = "Cannot evict pod as it would violate the pod's disruption budget."
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
"""policy/v1 DisruptionBudgetCause: the Status cause that names the budget."""
MULTIPLE_BUDGETS = (
    "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support."
)
UNPROCESSED_RETRY_AFTER = 10
"""Seconds the real server suggests waiting while a budget is not processed yet."""
_IGNORES_BUDGETS = frozenset(("Pending", "Succeeded", "Failed"))
_ALWAYS_ALLOW = "AlwaysAllow"

Lookup = Callable[[str, str, str, str], "Obj | None"]
"""(apiVersion, kind, namespace, name) -> the stored object, None when there is none; `Unscalable` when the
kind has no scale subresource (or is not served)."""


class Unscalable(Exception):  # noqa: N818 -- the controller's words: the kind does not implement scale
    """A controller whose kind has no scale subresource: the disruption controller cannot count it."""


class _Unprocessed(Exception):  # noqa: N818 -- what the budget's status would say: not processed
    pass


@dataclass(frozen=True)
class BudgetStatus:
    """What the disruption controller would write into the budget's status now."""

    expected_pods: int
    desired_healthy: int
    current_healthy: int
    disruptions_allowed: int


def refusal(pod: Obj, budgets: Iterable[Obj], pods: Iterable[Obj], lookup: Lookup) -> ApiError | None:
    """Why evicting `pod` is refused under `budgets` (those of its namespace), counting `pods` (every pod
    of its namespace); None when it may go."""
    if _ignores_budgets(pod):
        return None
    labels = labels_of(pod)
    selecting = [b for b in budgets if _selects(b, labels)]
    if len(selecting) > 1:
        return ApiError(500, "", MULTIPLE_BUDGETS)
    if not selecting:
        return None
    pdb = selecting[0]
    name = str(meta(pdb).get("name", ""))
    spec = pdb.get("spec") or {}
    selected = [p for p in pods if _selects(pdb, labels_of(p))]
    try:
        status = budget_status(pdb, selected, lookup)
    except _Unprocessed:
        cause = f"The disruption budget {name} is still being processed by the server."
        return too_many_requests(
            REFUSED, [{"reason": DISRUPTION_BUDGET_CAUSE, "message": cause}], UNPROCESSED_RETRY_AFTER
        )
    if not is_ready(pod):
        if spec.get("unhealthyPodEvictionPolicy") == _ALWAYS_ALLOW:
            return None
        if status.current_healthy >= status.desired_healthy and status.desired_healthy > 0:
            return None
    if status.disruptions_allowed > 0:
        return None
    cause = (
        f"The disruption budget {name} needs {status.desired_healthy} healthy pods "
        f"and has {status.current_healthy} currently"
    )
    return too_many_requests(REFUSED, [{"reason": DISRUPTION_BUDGET_CAUSE, "message": cause}])


def budget_status(pdb: Obj, selected: list[Obj], lookup: Lookup) -> BudgetStatus:
    """The disruption controller's count for `pdb` over the pods it `selected`; `_Unprocessed` where the
    controller's sync would fail."""
    spec = pdb.get("spec") or {}
    max_unavailable = spec.get("maxUnavailable")
    min_available = spec.get("minAvailable")
    expected, desired = 0, 0
    if max_unavailable is not None:
        expected = _expected_scale(selected, lookup)
        desired = max(0, expected - _scaled(max_unavailable, expected))
    elif isinstance(min_available, int) and not isinstance(min_available, bool):
        expected, desired = len(selected), min_available
    elif min_available is not None:
        expected = _expected_scale(selected, lookup)
        desired = _scaled(min_available, expected)
    healthy = sum(1 for p in selected if not meta(p).get("deletionTimestamp") and is_ready(p))
    allowed = healthy - desired
    if expected <= 0 or allowed <= 0:
        allowed = 0
    return BudgetStatus(expected, desired, healthy, allowed)


def _ignores_budgets(pod: Obj) -> bool:
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return phase in _IGNORES_BUDGETS or bool(meta(pod).get("deletionTimestamp"))


def _selects(pdb: Obj, labels: dict[str, str]) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    if not isinstance(selector, dict):
        return False  # no selector selects nothing in policy/v1
    try:
        return label_selector_of(selector).matches({"metadata": {"labels": labels}})
    except ApiError:
        return False  # an invalid selector matches no pod


def _scaled(value: Any, total: int) -> int:
    """intstr.GetScaledValueFromIntOrPercent(value, total, roundUp=true)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.endswith("%"):
        try:
            percent = int(value[:-1])
        except ValueError:
            raise _Unprocessed from None
        return math.ceil(percent * total / 100)
    raise _Unprocessed


def _expected_scale(selected: list[Obj], lookup: Lookup) -> int:
    """The summed scale of the selected pods' controllers, each counted once."""
    scales: dict[str, int] = {}
    for pod in selected:
        ref = controller_of(pod)
        if ref is None:
            continue  # an unmanaged pod: the controller reports it and counts it nowhere
        uid = str(ref.get("uid", ""))
        if uid in scales:
            continue
        found = _controller_scale(ref, str(meta(pod).get("namespace", "")), lookup)
        if found is None:
            raise _Unprocessed  # found no controllers for the pod
        scales[found[0]] = found[1]
    return sum(scales.values())


def _controller_scale(ref: Obj, namespace: str, lookup: Lookup) -> tuple[str, int] | None:
    """(uid, replicas) of the controller `ref` names, as the controller's finders see it."""
    kind = str(ref.get("kind", ""))
    try:
        owner = lookup(str(ref.get("apiVersion", "")), kind, namespace, str(ref.get("name", "")))
    except Unscalable:
        raise _Unprocessed from None
    if owner is None or meta(owner).get("uid") != ref.get("uid"):
        return None
    if kind == "ReplicaSet":
        above = controller_of(owner)
        if above is not None and above.get("kind") == "Deployment":
            deployment = _controller_scale(above, namespace, lookup)
            if deployment is not None:
                return deployment
    replicas = (owner.get("spec") or {}).get("replicas", 1)
    if not isinstance(replicas, int) or isinstance(replicas, bool):
        raise _Unprocessed
    return str(meta(owner).get("uid", "")), replicas
