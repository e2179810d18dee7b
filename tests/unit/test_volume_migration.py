"""Specs for CSI migration in NodeVolumeLimits (`shared.core.volumes`, issue 30 deliverable 1): in-tree disks
count against the node's limit of the CSI driver migration hands them to, as kube-scheduler counts them
today (its isCSIMigrationOn: AWS EBS, GCE PD, Azure Disk and Cinder wherever the node has a CSINode,
Portworx where the CSINode's ``storage.kubernetes.io/migrated-plugins`` lists it), and their translation.

Each row: one pod already on node-1 holding one disk, a pending pod asking for a second, and node-1's
CSINode allowing one volume of the migrated driver: the pending pod is refused when both count against
that limit, placed when they do not.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core import volumes as v
from shared.kube import translate, wire
from shared.kube.volumes import WireCsiNode, WireVolume, csi_node_of, decode, volume_of
from shared.model import Pod
from shared.model.volumes import (
    AWS_EBS,
    AZURE_DISK,
    CINDER,
    GCE_PD,
    MIGRATED_DRIVERS,
    PORTWORX,
    Claim,
    CsiNode,
    InlineVolume,
    PersistentVolume,
    StorageClass,
    Volumes,
)
from tests.unit.test_volumes import claim, job, node, pending_reason, placements, run, snapshot

NODE = "node-1"


def in_tree_pv(name: str, plugin: str, handle: str | None = None) -> PersistentVolume:
    return PersistentVolume(
        name=name, storage_class="", in_tree_plugin=plugin, volume_handle=handle or f"disk-{name}"
    )


def bound(name: str, volume: str) -> Claim:
    return claim(name, cls="", volume_name=volume, bound=True)


def with_inline(pods: list[Pod], *disks: InlineVolume) -> list[Pod]:
    return [msgspec.structs.replace(p, inline_volumes=disks) for p in pods]


def csi_node(driver: str, limit: int = 1, migrated: tuple[str, ...] = ()) -> CsiNode:
    return CsiNode(name=NODE, limits={driver: limit}, migrated_plugins=migrated)


def outcome(volumes: Volumes, holder: tuple[Any, list[Pod]], asker: tuple[Any, list[Pod]]) -> str:
    result = run(snapshot([node(NODE)], [holder, asker], volumes))
    if placements(result):
        return "placed"
    assert v.MAX_VOLUME_COUNT in pending_reason(result, "asker")
    return "refused"


def pvs_case(plugin: str, limit_driver: str, migrated: tuple[str, ...] = ()) -> tuple[Volumes, Any, Any]:
    volumes = Volumes(
        claims=(bound("held", "pv-held"), bound("asked", "pv-asked")),
        volumes=(in_tree_pv("pv-held", plugin), in_tree_pv("pv-asked", plugin)),
        csi_nodes=(csi_node(limit_driver, migrated=migrated),),
    )
    return volumes, job("holder", "held", running_on=NODE), job("asker", "asked")


@pytest.mark.parametrize(
    ("plugin", "limit_driver", "migrated", "expected"),
    [
        pytest.param(
            AWS_EBS, "ebs.csi.aws.com", (), "refused", id="EBS volumes count against ebs.csi.aws.com"
        ),
        pytest.param(
            GCE_PD, "pd.csi.storage.gke.io", (), "refused", id="GCE PDs count against the PD driver"
        ),
        pytest.param(AZURE_DISK, "disk.csi.azure.com", (), "refused", id="Azure disks count against theirs"),
        pytest.param(
            CINDER, "cinder.csi.openstack.org", (), "refused", id="Cinder volumes count against theirs"
        ),
        pytest.param(
            AWS_EBS,
            "pd.csi.storage.gke.io",
            (),
            "placed",
            id="an EBS volume does not count against another driver",
        ),
        pytest.param(
            PORTWORX,
            "pxd.portworx.com",
            (PORTWORX,),
            "refused",
            id="Portworx counts where the CSINode lists it",
        ),
        pytest.param(
            PORTWORX,
            "pxd.portworx.com",
            (),
            "placed",
            id="Portworx not listed as migrated on the node: not counted",
        ),
    ],
)
def test_in_tree_volumes_count_against_the_migrated_drivers_limit(
    plugin: str, limit_driver: str, migrated: tuple[str, ...], expected: str
) -> None:
    volumes, holder, asker = pvs_case(plugin, limit_driver, migrated)
    assert outcome(volumes, holder, asker) == expected


def test_an_in_tree_volume_without_a_migrated_plugin_is_not_counted() -> None:
    volumes = Volumes(
        claims=(bound("held", "pv-held"), bound("asked", "pv-asked")),
        volumes=(PersistentVolume(name="pv-held"), PersistentVolume(name="pv-asked")),
        csi_nodes=(csi_node("ebs.csi.aws.com"),),
    )
    assert outcome(volumes, job("holder", "held", running_on=NODE), job("asker", "asked")) == "placed"


@pytest.mark.parametrize(
    ("held", "asked", "expected"),
    [
        pytest.param(
            InlineVolume(AWS_EBS, "vol-1"),
            InlineVolume(AWS_EBS, "vol-2"),
            "refused",
            id="two inline EBS disks",
        ),
        pytest.param(
            InlineVolume(AWS_EBS, "vol-1"),
            InlineVolume(AWS_EBS, "vol-1"),
            "placed",
            id="the same disk inline in two pods attaches once",
        ),
        pytest.param(
            InlineVolume(GCE_PD, "pd-1"), InlineVolume(AWS_EBS, "vol-1"), "placed", id="disks of two drivers"
        ),
    ],
)
def test_in_tree_disks_named_inline_count_too(held: InlineVolume, asked: InlineVolume, expected: str) -> None:
    holder_pg, holder_pods = job("holder", running_on=NODE)
    asker_pg, asker_pods = job("asker")
    volumes = Volumes(csi_nodes=(csi_node("ebs.csi.aws.com"),))
    holder = (holder_pg, with_inline(holder_pods, held))
    asker = (asker_pg, with_inline(asker_pods, asked))
    assert outcome(volumes, holder, asker) == expected


def test_an_inline_disk_and_a_volume_of_the_same_disk_attach_once() -> None:
    volumes = Volumes(
        claims=(bound("held", "pv-held"),),
        volumes=(in_tree_pv("pv-held", AWS_EBS, "vol-1"),),
        csi_nodes=(csi_node("ebs.csi.aws.com"),),
    )
    pg, pods = job("asker")
    assert (
        outcome(
            volumes,
            job("holder", "held", running_on=NODE),
            (pg, with_inline(pods, InlineVolume(AWS_EBS, "vol-1"))),
        )
        == "placed"
    )


def test_a_claim_of_an_in_tree_provisioners_class_counts_against_the_migrated_driver() -> None:
    ebs = StorageClass(name="gp2", provisioner=AWS_EBS, binding_mode="WaitForFirstConsumer")
    volumes = Volumes(
        claims=(bound("held", "pv-held"), claim("asked", cls="gp2")),
        volumes=(in_tree_pv("pv-held", AWS_EBS),),
        classes=(ebs,),
        csi_nodes=(csi_node("ebs.csi.aws.com"),),
    )
    assert outcome(volumes, job("holder", "held", running_on=NODE), job("asker", "asked")) == "refused"


def test_the_migrated_drivers_are_csi_translation_libs() -> None:
    assert MIGRATED_DRIVERS == {
        AWS_EBS: "ebs.csi.aws.com",
        GCE_PD: "pd.csi.storage.gke.io",
        AZURE_DISK: "disk.csi.azure.com",
        CINDER: "cinder.csi.openstack.org",
        PORTWORX: "pxd.portworx.com",
    }


# --- translation ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("source", "plugin", "handle"),
    [
        pytest.param({"awsElasticBlockStore": {"volumeID": "vol-1"}}, AWS_EBS, "vol-1", id="EBS"),
        pytest.param(
            {"awsElasticBlockStore": {"volumeID": "aws://us-east-1a/vol-1"}},
            AWS_EBS,
            "vol-1",
            id="EBS by URL",
        ),
        pytest.param({"gcePersistentDisk": {"pdName": "pd-1"}}, GCE_PD, "pd-1", id="GCE PD"),
        pytest.param({"azureDisk": {"diskName": "d", "diskURI": "/sub/d"}}, AZURE_DISK, "/sub/d", id="Azure"),
        pytest.param({"cinder": {"volumeID": "c-1"}}, CINDER, "c-1", id="Cinder"),
        pytest.param({"portworxVolume": {"volumeID": "px-1"}}, PORTWORX, "px-1", id="Portworx"),
        pytest.param({"nfs": {"server": "s", "path": "/"}}, "", "", id="a source migration does not move"),
    ],
)
def test_a_volumes_and_a_pods_in_tree_source_is_read(
    source: dict[str, Any], plugin: str, handle: str
) -> None:
    body = {"metadata": {"name": "pv"}, "spec": source}
    raw = decode("persistentvolumes", msgspec.json.encode(body))
    assert isinstance(raw, WireVolume)
    got = volume_of(raw)
    assert (got.in_tree_plugin, got.volume_handle) == (plugin, handle)
    pod = wire.convert(
        "Pod",
        {
            "metadata": {"name": "p", "namespace": "ns", "annotations": {"pod-group-name": "g"}},
            "spec": {"volumes": [{"name": "disk", **source}]},
        },
    )
    expected = (InlineVolume(plugin, handle),) if plugin else ()
    assert translate.pod_of(pod).inline_volumes == expected


def test_a_csi_volumes_handle_is_its_disk() -> None:
    body = {"metadata": {"name": "pv"}, "spec": {"csi": {"driver": "d", "volumeHandle": "h-1"}}}
    raw = decode("persistentvolumes", msgspec.json.encode(body))
    assert isinstance(raw, WireVolume)
    assert (volume_of(raw).csi_driver, volume_of(raw).volume_handle) == ("d", "h-1")


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param(None, (), id="no annotation"),
        pytest.param("", (), id="empty"),
        pytest.param(PORTWORX, (PORTWORX,), id="one plugin"),
        pytest.param(f"{AWS_EBS},{PORTWORX}", (AWS_EBS, PORTWORX), id="comma-separated"),
    ],
)
def test_a_csinodes_migrated_plugins_are_read_from_its_annotation(
    annotation: str | None, expected: tuple[str, ...]
) -> None:
    meta: dict[str, Any] = {"name": NODE}
    if annotation is not None:
        meta["annotations"] = {"storage.kubernetes.io/migrated-plugins": annotation}
    raw = decode("csinodes", msgspec.json.encode({"metadata": meta}))
    assert isinstance(raw, WireCsiNode)
    assert csi_node_of(raw).migrated_plugins == expected
