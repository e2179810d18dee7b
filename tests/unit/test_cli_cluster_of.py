"""Spec: the CLI reads a state snapshot reply into the cluster the core sees in one place
(`tools.cli.cluster_cmds.cluster_of`, for `kairos status`, `kairos explain` and `kairos snapshot`), and
that place carries every object the reply and a `Snapshot` share."""

from __future__ import annotations

from shared.contracts.messages import SnapshotReply
from shared.model import Namespace, Snapshot, Topology
from shared.model.builders import flat_queues, gang, gpu_nodes
from shared.model.dra import Dra
from shared.model.volumes import Volumes
from tools.cli.cluster_cmds import cluster_of


def test_every_object_of_the_snapshot_reply_reaches_the_cluster_the_cli_reads() -> None:
    shared = set(Snapshot.__struct_fields__) & set(SnapshotReply.__struct_fields__)
    group, pods = gang("g", "q", 2, gpus=1)
    reply = SnapshotReply(
        revision=7,
        ledger_revision=3,
        nodes=tuple(gpu_nodes(2)),
        queues=tuple(flat_queues(["q"])),
        podgroups=(group,),
        pods=tuple(pods),
        topologies=(Topology(name="t", levels=("zone",)),),
        namespaces=(Namespace(name="ns"),),
        volumes=Volumes(),
        dra=Dra(),
    )
    cluster = cluster_of(reply)
    for field in shared:
        assert getattr(cluster, field) == getattr(reply, field), field
    assert shared == set(Snapshot.__struct_fields__), "a snapshot's objects the reply does not carry"
