"""A watch of the pods of one namespace of the stack's cluster: each pod's name and node, as it changes.

`pod_watch(kube, namespace, on_pod)` is a `shared.kubeapi.informer.Informer` on the pods of `namespace`
that calls `on_pod(event, name, node)` for every change (ADDED, MODIFIED, DELETED; `node` is the pod's
`spec.nodeName`, "" while unbound) and for every pod of a list, as ADDED. The benchmarks
(`tools.bench.bus`) and the chaos suite (`tools.chaos.runner`) time binds by the moment a pod's node
arrives on it. A pod that does not decode is the informer's to log and count.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from shared.kubeapi.client import Kube
from shared.kubeapi.informer import Informer

__all__ = ["OnPod", "pod_watch"]

OnPod = Callable[[str, str, str], Awaitable[None]]
"""on_pod(event, pod name, node name)."""


class _Meta(msgspec.Struct):
    name: str = ""


class _Spec(msgspec.Struct):
    nodeName: str = ""  # noqa: N815 -- the Kubernetes field name


class _Pod(msgspec.Struct):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    spec: _Spec = msgspec.field(default_factory=_Spec)


_POD = msgspec.json.Decoder(_Pod)


def pod_watch(kube: Kube, namespace: str, on_pod: OnPod) -> Informer:
    """An informer on the pods of `namespace` that hands each one's name and node to `on_pod`."""

    async def on_relist(items: list[msgspec.Raw]) -> None:
        for raw in items:
            await on_change("ADDED", raw)

    async def on_change(event: str, raw: msgspec.Raw) -> None:
        pod = _POD.decode(raw)
        await on_pod(event, pod.metadata.name, pod.spec.nodeName)

    return Informer(
        kube,
        "pods",
        kube.core.list_namespaced_pod,
        on_relist,
        on_change,
        args=(namespace,),
    )
