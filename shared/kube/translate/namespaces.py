"""Kubernetes Namespaces to the model's `Namespace`: its name and labels, what a pod affinity term's
namespace selector reads.

Called by the state service's mirror (`namespace_of`).
"""

from __future__ import annotations

from shared.kube import wire
from shared.model import Namespace


def namespace_of(namespace: wire.Namespace) -> Namespace:
    """The model namespace: its name and labels (what a pod affinity term's namespace selector reads)."""
    return Namespace(namespace.metadata.name, dict(namespace.metadata.labels))
