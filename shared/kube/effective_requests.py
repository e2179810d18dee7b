"""A pod's effective requests as the kubelet admits it and kube-scheduler fits it (KEP-753, native sidecars).

A pod runs its init containers one after the other, then its containers together. An init container with
``restartPolicy: Always`` is a sidecar: it starts in its turn and keeps running beside everything after it,
the containers included. So what the pod needs of a node at its busiest is the larger of

- the containers and every sidecar together (the pod once started), and
- for each init container in turn, what runs while it does: a regular one plus the sidecars started before
  it; a sidecar plus the sidecars before it (its own start),

per resource, plus the pod overhead (added by the callers, which round and split the resources). Without
sidecars this is the familiar max(sum of containers, largest init container). KAI reads a pod the same
way since v0.15 (``getPodResourceRequest`` calls the Kubernetes helper ``AggregateContainerRequests``).

Example (Istio-style): a 1-CPU container beside a 0.5-CPU sidecar needs 1.5 CPU, where the old rule, which
took the sidecar for a run-to-completion init container, counted 1.

Pure: callers pass each container's requests as exact amounts (`shared.kube.translate.pod_requests` for the
model, `tools.kubesim.scheduler.pod_requests` for the simulated default scheduler).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

__all__ = ["SIDECAR_RESTART_POLICY", "effective_requests", "is_sidecar"]

SIDECAR_RESTART_POLICY = "Always"
"""The only ``restartPolicy`` an init container may set (KEP-753): it makes the container a sidecar."""

Amounts = Mapping[str, Fraction]


def is_sidecar(restart_policy: object) -> bool:
    """Whether an init container with this ``restartPolicy`` is a sidecar (unset: a regular one)."""
    return restart_policy == SIDECAR_RESTART_POLICY


def _add(into: dict[str, Fraction], amounts: Amounts) -> None:
    for resource, amount in amounts.items():
        into[resource] = into.get(resource, Fraction(0)) + amount


def _at_least(into: dict[str, Fraction], amounts: Amounts) -> None:
    for resource, amount in amounts.items():
        if amount > into.get(resource, Fraction(0)):
            into[resource] = amount


def effective_requests(
    containers: Iterable[Amounts], init_containers: Iterable[tuple[bool, Amounts]]
) -> dict[str, Fraction]:
    """The pod's requests per resource, overhead aside: `containers` are the regular containers' requests,
    `init_containers` (sidecar?, requests) in the pod's order."""
    running: dict[str, Fraction] = {}
    for amounts in containers:
        _add(running, amounts)
    sidecars: dict[str, Fraction] = {}
    """The sidecars started so far."""
    peak: dict[str, Fraction] = {}
    """The most any init container's turn needs."""
    for sidecar, amounts in init_containers:
        if sidecar:
            _add(sidecars, amounts)
            _at_least(peak, sidecars)
        else:
            during = dict(sidecars)
            _add(during, amounts)
            _at_least(peak, during)
    _add(running, sidecars)
    _at_least(running, peak)
    return running
