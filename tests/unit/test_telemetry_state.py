"""Telemetry reaching the state KV: the simulated cluster measures its labelled GPU nodes from the pods
placed there, and the Kubernetes mirror folds the agents' telemetry into its nodes; both rewrite a node
only past the hysteresis threshold or on a health change."""

from __future__ import annotations

from pathlib import Path

import msgspec

from services.state.mirror.cache import Mirror
from services.state.mirror.gpu_usage import SIM_TELEMETRY_LABEL, UNHEALTHY_GPUS_LABEL
from services.state.mirror.raw_objects import NODES
from services.state.sources.sim_source import TELEMETRY_PERIOD, SimulatedCluster
from shared.clusterfile import load_cluster
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import DeviceTelemetry, GpuTelemetry
from shared.contracts.inventory import GpuDevice, GpuInventory
from shared.contracts.messages import ApplyRequest, Binding
from shared.model import Node
from shared.model.builders import flat_queues, gang, gpu_nodes
from tests.unit.test_state_mirror import node as raw_node

NOW = 1_800_000_000.0
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def measured_node(name: str = "n1", gpus: int = 2, **labels: str) -> Node:
    base = gpu_nodes(1, gpus=gpus)[0]
    return msgspec.structs.replace(base, name=name, labels={SIM_TELEMETRY_LABEL: "true", **labels})


def cluster_with(*nodes: Node) -> SimulatedCluster:
    cluster = SimulatedCluster()
    pg, pods = gang("infer", "q", 2, 0.5)
    cluster.apply(
        ApplyRequest(nodes=nodes, queues=tuple(flat_queues(["q"])), podgroups=(pg,), pods=tuple(pods)), 0.0
    )
    return cluster


def node_of(cluster: SimulatedCluster, name: str = "n1") -> Node:
    node = cluster.objects[s.node_key(name)]
    assert isinstance(node, Node)
    return node


def test_a_labelled_gpu_node_is_measured_every_telemetry_period() -> None:
    cluster = cluster_with(measured_node(), msgspec.structs.replace(gpu_nodes(1)[0], name="plain"))
    assert cluster.next_due() == TELEMETRY_PERIOD
    changes = cluster.fire(TELEMETRY_PERIOD)
    assert [c.key for c in changes] == [s.node_key("n1")]
    devices = node_of(cluster).gpu_devices
    assert [d.index for d in devices] == [0, 1]
    assert all(d.healthy and d.utilisation_pct <= 4 for d in devices)
    assert node_of(cluster, "plain").gpu_devices == ()
    assert cluster.next_due() == 2 * TELEMETRY_PERIOD


def test_placed_fractions_show_on_their_device_and_small_moves_write_nothing() -> None:
    cluster = cluster_with(measured_node())
    cluster.fire(TELEMETRY_PERIOD)
    for pod in ("infer-0", "infer-1"):
        cluster.bind(
            Binding(pod=pod, namespace="", name=pod, podgroup="infer", node="n1", gpu_groups=("g-a",)), 6.0
        )
    t = TELEMETRY_PERIOD
    for _ in range(40):  # 200 s: a few half-lives
        t += TELEMETRY_PERIOD
        cluster.fire(t)
    shared = next(d for d in node_of(cluster).gpu_devices if d.gpu_group == "g-a")
    assert 85 <= shared.utilisation_pct <= 100
    assert 90 <= shared.memory_pct <= 100
    # A steady load: readings keep coming, the node is not rewritten.
    assert cluster.fire(t + TELEMETRY_PERIOD) == []


def test_a_device_reporting_xid_is_unhealthy_on_the_next_reading() -> None:
    cluster = cluster_with(measured_node(**{UNHEALTHY_GPUS_LABEL: "1"}))
    cluster.fire(TELEMETRY_PERIOD)
    devices = node_of(cluster).gpu_devices
    assert [(d.healthy, d.reason) for d in devices] == [(True, ""), (False, "XID 79")]


def test_an_apply_keeps_the_measured_devices_and_a_restore_undoes_a_reading() -> None:
    cluster = cluster_with(measured_node())
    cluster.fire(TELEMETRY_PERIOD)
    measured = node_of(cluster).gpu_devices
    cluster.apply(ApplyRequest(nodes=(measured_node(),)), 6.0)
    assert node_of(cluster).gpu_devices == measured
    saved = cluster.checkpoint()
    cluster.apply(ApplyRequest(nodes=(measured_node(**{UNHEALTHY_GPUS_LABEL: "0"}),)), 7.0)
    cluster.fire(2 * TELEMETRY_PERIOD)
    assert not node_of(cluster).gpu_devices[0].healthy
    cluster.restore(saved)
    assert node_of(cluster).gpu_devices == measured
    assert cluster.next_due() == 2 * TELEMETRY_PERIOD


def test_without_a_measured_node_there_is_no_telemetry_timer() -> None:
    cluster = cluster_with(msgspec.structs.replace(gpu_nodes(1)[0], name="plain"))
    assert cluster.next_due() is None


# --- the Kubernetes mirror ---------------------------------------------------------------------------------
def reading(time: float, *uses: float, xid: tuple[int, ...] = ()) -> GpuTelemetry:
    return GpuTelemetry(
        node="n1",
        time=time,
        period=5.0,
        devices=tuple(
            DeviceTelemetry(
                index=i,
                uuid=f"GPU-{i}",
                utilisation_pct=use,
                memory_used_mib=0,
                memory_total_mib=80000,
                xid_errors=xid if i == 0 else (),
            )
            for i, use in enumerate(uses)
        ),
    )


def mirrored_node(m: Mirror) -> Node:
    node = m.current[s.node_key("n1")]
    assert isinstance(node, Node)
    return node


def test_the_mirror_folds_telemetry_into_the_node_with_hysteresis() -> None:
    m = Mirror()
    m.relist(NODES, [raw_node("n1", gpus=2)])
    m.flush(NOW)
    assert mirrored_node(m).gpu_devices == ()
    m.telemetry(reading(NOW, 50.0, 0.0))
    (change,) = m.flush(NOW)
    assert [d.utilisation_pct for d in mirrored_node(m).gpu_devices] == [50.0, 0.0]
    assert change.key == s.node_key("n1")
    m.telemetry(reading(NOW + 5, 60.0, 0.0))  # the average moves ~1 point: nothing to write
    assert m.flush(NOW + 5) == []
    m.telemetry(reading(NOW + 10, 50.0, 0.0, xid=(79,)))
    m.flush(NOW + 10)
    assert [(d.healthy, d.reason) for d in mirrored_node(m).gpu_devices] == [(False, "XID 79"), (True, "")]


def test_the_mirror_drops_the_devices_of_an_agent_gone_silent() -> None:
    m = Mirror()
    m.relist(NODES, [raw_node("n1", gpus=2)])
    m.telemetry(reading(NOW, 50.0, 0.0))
    m.flush(NOW)
    assert mirrored_node(m).gpu_devices != ()
    m.touch_nodes()
    m.flush(NOW + 60)
    assert mirrored_node(m).gpu_devices == ()


def test_the_readme_s_telemetry_examples_load_with_measured_nodes_and_a_broken_device() -> None:
    cluster = load_cluster(EXAMPLES / "gpu-telemetry.yaml")
    assert all(n.labels.get(SIM_TELEMETRY_LABEL) == "true" for n in cluster.nodes)
    assert [n.labels.get(UNHEALTHY_GPUS_LABEL) for n in cluster.nodes] == [None, "3"]
    assert [p.gpu.devices for p in load_cluster(EXAMPLES / "gpu-finetune.yaml").pods] == [4]
    assert [p.gpu.fraction for p in load_cluster(EXAMPLES / "gpu-inference.yaml").pods] == [0.5] * 3


def test_a_device_the_inventory_reports_unhealthy_is_marked_as_already_left_out() -> None:
    m = Mirror()
    m.relist(NODES, [raw_node("n1", gpus=2)])
    sick = GpuDevice(index=0, uuid="GPU-0", memory_mib=80000, healthy=False, error="2 uncorrected ECC errors")
    m.inventory(
        GpuInventory(
            node="n1",
            time=NOW,
            period=30.0,
            devices=(sick, GpuDevice(index=1, uuid="GPU-1", memory_mib=80000)),
        )
    )
    m.telemetry(reading(NOW, 0.0, 0.0, xid=(48,)))
    m.flush(NOW)
    node = mirrored_node(m)
    assert node.gpus == 1
    assert [(d.healthy, d.excluded) for d in node.gpu_devices] == [(False, True), (True, False)]
