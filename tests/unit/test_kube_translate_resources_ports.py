"""Translation of what a pod asks of a node beyond CPU, memory and GPUs: extended resources, huge pages
and ephemeral storage (`Pod.scalars`, `Node.scalars`), and the host ports it binds (`Pod.host_ports`).

Specifications of `shared.kube.translate`, with the API-server-shaped builders of its main spec.
"""

from __future__ import annotations

from typing import Any

import pytest

from shared.errors import InvalidObject
from shared.kube import translate
from shared.model import HostPort
from tests.unit.test_kube_translate import node, node_doc, pod, pod_doc

GI = 2**30


def container(name: str, requests: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    return {"name": name, "resources": {"requests": requests or {}}, **fields}


def with_containers(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    doc = pod_doc(**spec)
    doc["spec"]["containers"] = list(containers)
    return doc


# --- scalars ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("requests", "scalars"),
    [
        pytest.param({"rdma/ib": "2"}, {"rdma/ib": 2.0}, id="vendor extended resource"),
        pytest.param({"example.com/foo": "1k"}, {"example.com/foo": 1000.0}, id="suffixed extended resource"),
        pytest.param({"hugepages-2Mi": "10Mi"}, {"hugepages-2Mi": 10.0 * 2**20}, id="huge pages in bytes"),
        pytest.param({"hugepages-1Gi": "2Gi"}, {"hugepages-1Gi": 2.0 * GI}, id="huge pages of another size"),
        pytest.param({"ephemeral-storage": "1.5Gi"}, {"ephemeral-storage": 1.5 * GI}, id="ephemeral storage"),
        pytest.param({"ephemeral-storage": "500m"}, {"ephemeral-storage": 1.0}, id="rounded up to a byte"),
        pytest.param({"rdma/ib": "0"}, {}, id="a zero request asks nothing"),
        pytest.param({"kubernetes.io/batteries": "1"}, {}, id="kubernetes.io names are not extended"),
        pytest.param(
            {"nvidia.com/gpu": "1", "nvidia.com/mig-1g.10gb": "0", "cpu": "1", "memory": "1Gi"},
            {},
            id="cpu, memory, GPUs and MIG are not scalars",
        ),
    ],
)
def test_a_pods_countable_requests_become_scalars_in_node_units(
    requests: dict[str, str], scalars: dict[str, float]
) -> None:
    assert translate.pod_of(pod(pod_doc(requests))).scalars == scalars


@pytest.mark.parametrize(
    ("resource", "quantity"),
    [("rdma/ib", "3"), ("hugepages-2Mi", "6Mi"), ("ephemeral-storage", "100.5"), ("example.com/fpga", "1")],
)
def test_pod_and_node_count_a_resource_in_the_same_units(resource: str, quantity: str) -> None:
    on_node = translate.node_of(node(node_doc(cpu="8", memory="1Gi", pods="10", **{resource: quantity})))
    asked = translate.pod_of(pod(pod_doc({resource: quantity})))
    assert asked.scalars[resource] == on_node.scalars[resource]


def test_scalars_follow_the_effective_request_rule_of_cpu_and_memory() -> None:
    # Containers add up (1 + 1), an init container counts alone and wins when larger (3 > 2 for rdma/ib,
    # 1 < 2 for storage), the overhead adds on top.
    doc = with_containers(
        container("main", {"rdma/ib": "1", "ephemeral-storage": "1Gi"}),
        container("side", {"rdma/ib": "1", "ephemeral-storage": "1Gi"}),
        initContainers=[container("init", {"rdma/ib": "3", "ephemeral-storage": "1Gi"})],
        overhead={"ephemeral-storage": "1Mi"},
    )
    assert translate.pod_of(pod(doc)).scalars == {"ephemeral-storage": 2.0 * GI + 2**20, "rdma/ib": 3.0}
    assert translate.pod_requests(pod(doc)).scalars == {"ephemeral-storage": 2 * GI + 2**20, "rdma/ib": 3}


def test_a_scalar_limit_without_a_request_requests_the_limit() -> None:
    doc = pod_doc()
    doc["spec"]["containers"][0]["resources"] = {"limits": {"rdma/ib": "2", "hugepages-2Mi": "4Mi"}}
    assert translate.pod_of(pod(doc)).scalars == {"hugepages-2Mi": 4.0 * 2**20, "rdma/ib": 2.0}


@pytest.mark.parametrize(
    ("doc", "field"),
    [
        pytest.param(
            pod_doc({"rdma/ib": "-1"}), "spec.containers[0].resources.requests[rdma/ib]", id="negative"
        ),
        pytest.param(
            pod_doc({"hugepages-2Mi": "lots"}),
            "spec.containers[0].resources.requests[hugepages-2Mi]",
            id="not a number",
        ),
        pytest.param(
            with_containers(container("main"), initContainers=[container("init", {"example.com/foo": "-2"})]),
            "spec.initContainers[0].resources.requests[example.com/foo]",
            id="in an init container",
        ),
        pytest.param(
            pod_doc(overhead={"ephemeral-storage": "-1Gi"}),
            "spec.overhead[ephemeral-storage]",
            id="in the overhead",
        ),
    ],
)
def test_a_bad_scalar_quantity_names_the_pod_and_its_field(doc: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidObject) as info:
        translate.pod_of(pod(doc))
    assert (info.value.kind, info.value.name, info.value.field) == ("Pod", "team-a/train-0", field)


# --- host ports ------------------------------------------------------------------------------------------
def port(**fields: Any) -> dict[str, Any]:
    return {"containerPort": 80, **fields}


@pytest.mark.parametrize(
    ("ports", "host_ports"),
    [
        pytest.param([port()], (), id="a container port alone binds nothing on the node"),
        pytest.param([port(hostPort=0)], (), id="host port 0 is unset"),
        pytest.param([port(hostPort=8080)], (HostPort(8080, "TCP", "0.0.0.0"),), id="TCP on every address"),
        pytest.param(
            [port(hostPort=53, protocol="UDP", hostIP="10.0.0.1")],
            (HostPort(53, "UDP", "10.0.0.1"),),
            id="protocol and address kept",
        ),
        pytest.param([port(hostPort=9, protocol="")], (HostPort(9, "TCP"),), id="an empty protocol is TCP"),
        pytest.param(
            [port(hostPort=1, protocol="SCTP"), port(), port(hostPort=65535)],
            (HostPort(1, "SCTP"), HostPort(65535)),
            id="only the entries with a host port, in order",
        ),
    ],
)
def test_container_ports_with_a_host_port_are_the_pods_host_ports(
    ports: list[dict[str, Any]], host_ports: tuple[HostPort, ...]
) -> None:
    doc = with_containers(container("main", ports=ports))
    assert translate.pod_of(pod(doc)).host_ports == host_ports


def test_sidecars_bind_their_host_ports_and_other_init_containers_do_not() -> None:
    # kube-scheduler's GetHostPorts: init containers that run as long as the pod (restartPolicy Always),
    # then the containers.
    doc = with_containers(
        container("main", ports=[port(hostPort=8080)]),
        initContainers=[
            container("setup", ports=[port(hostPort=7000)]),
            container("proxy", ports=[port(hostPort=15001)], restartPolicy="Always"),
        ],
    )
    assert translate.pod_of(pod(doc)).host_ports == (HostPort(15001), HostPort(8080))


@pytest.mark.parametrize(
    ("doc", "field", "problem"),
    [
        pytest.param(
            with_containers(container("main", ports=[port(), port(hostPort=70000)])),
            "spec.containers[0].ports[1].hostPort",
            "within 1-65535",
            id="above 65535",
        ),
        pytest.param(
            with_containers(container("a"), container("b", ports=[port(hostPort=-1)])),
            "spec.containers[1].ports[0].hostPort",
            "within 1-65535",
            id="negative",
        ),
        pytest.param(
            with_containers(container("main", ports=[port(hostPort=80, protocol="HTTP")])),
            "spec.containers[0].ports[0].protocol",
            "TCP, UDP, SCTP",
            id="unknown protocol",
        ),
        pytest.param(
            with_containers(
                container("main"),
                initContainers=[
                    container("proxy", ports=[port(hostPort=0), port(hostPort=65536)], restartPolicy="Always")
                ],
            ),
            "spec.initContainers[0].ports[1].hostPort",
            "within 1-65535",
            id="in a sidecar",
        ),
        pytest.param(
            with_containers(container("main", ports=[port(hostPort="80")])),
            "spec.containers[0].ports[0].hostPort",
            "Expected `int`",
            id="not a number",
        ),
    ],
)
def test_a_bad_host_port_names_the_pod_and_its_field(doc: dict[str, Any], field: str, problem: str) -> None:
    with pytest.raises(InvalidObject, match=problem) as info:
        translate.pod_of(pod(doc))
    assert (info.value.kind, info.value.name, info.value.field) == ("Pod", "team-a/train-0", field)
