"""The local stack's admission webhooks behind a Service, as a cluster runs them (deploy/base/webhook.yaml).

`kairos up` on kubesim registers ONE pod webhook (`kairos.io/after` and the quota gate) and ONE Queue
validation, both with `clientConfig.service` naming the Service `kai-scheduler/kairos-state-webhook`,
and writes that Service (no selector: nothing in kubesim would fill it) with an EndpointSlice per state
replica listing its webhook port on 127.0.0.1 (a slice's ports hold for all its endpoints, and the replicas
differ only by port). kubesim then sends each pod's and each Queue's review to one replica, the replicas in
turn, and passes it to the next when one is down (`tools.kubesim.webhooks`), so each replica reviews its
share of the pods, as behind a real Service: more state replicas divide the admission work instead of
each repeating it.

Registered again after kubesim restarts (`Stack.restart_kubesim`): its objects lived in its memory.
"""

from __future__ import annotations

from typing import Any

from shared.kube import queue_admission
from shared.kube.scheduling_gates import service_webhook_configuration
from tools.stack.bootstrap import replace_objects

__all__ = ["NAMESPACE", "PORT", "SERVICE", "endpoint_slices", "objects", "register", "service"]

Obj = dict[str, Any]

NAMESPACE = "kai-scheduler"
SERVICE = "kairos-state-webhook"
"""The Service's name, deploy/base's."""
PORT = 443
PORT_NAME = "https"
"""The Service's port and its name, which names the endpoints' port in each slice (deploy/base's)."""
_LABELS = {"app.kubernetes.io/part-of": "kairos", "app.kubernetes.io/component": "state-webhook"}


def service() -> Obj:
    """The Service in front of the state replicas' webhooks (its endpoints are the slices below)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": SERVICE, "namespace": NAMESPACE, "labels": dict(_LABELS)},
        "spec": {
            "type": "ClusterIP",
            "ports": [{"name": PORT_NAME, "port": PORT, "targetPort": "webhook", "protocol": "TCP"}],
        },
    }


def endpoint_slices(ports: list[int]) -> list[Obj]:
    """One EndpointSlice per state replica: its webhook port on 127.0.0.1, ready."""
    return [
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": f"{SERVICE}-{index}",
                "namespace": NAMESPACE,
                "labels": {
                    **_LABELS,
                    "kubernetes.io/service-name": SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "kairos-up",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": PORT_NAME, "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        }
        for index, port in enumerate(ports)
    ]


def objects(ports: list[int]) -> list[Obj]:
    """What `register` writes, in order: the Service and its slices, then the two webhook configurations
    (the Queue validation fail-open, so a restarting state service does not stop Queues being written)."""
    return [
        service(),
        *endpoint_slices(ports),
        service_webhook_configuration(NAMESPACE, SERVICE, port=PORT),
        queue_admission.service_webhook_configuration(NAMESPACE, SERVICE, port=PORT, failure_policy="Ignore"),
    ]


async def register(kubeconfig: str, ports: list[int]) -> None:
    """Write `objects(ports)` into the cluster, each replacing one of the same name."""
    await replace_objects(kubeconfig, objects(ports))
