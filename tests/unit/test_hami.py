"""HAMi-core's device memory limit (KAI v0.17's hamicore plugins): the binder's value
(`services.binder.hami.memory_limit`, the node's GPU memory times the pod's GPU_PORTION, in ``<MiB>m``) and the
admission's reference to it (`shared.kube.gpu_sharing.memory_limit_patch`, optional, from the capabilities
ConfigMap)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from services.binder import gpu_sharing_plan, hami
from services.binder.service import parse_options
from shared.errors import InvalidObject
from shared.kube import gpu_sharing, keys, wire
from tests.builders import pod_manifest
from tests.unit import test_deploy_manifests as deploy
from tools.kubesim.patch import json_patch

LABEL = keys.GPU_MEMORY_LABEL


@pytest.mark.parametrize(
    ("memory", "portion", "limit"),
    [
        ("81920", "0.50", "40960m"),
        ("81920", "1.00", "81920m"),
        ("15360", "0.27", "4147m"),  # gpu-memory 4096 on a T4: KAI's docs' example
        ("11264", "0.10", "1126m"),
        ("40960", "0.03", "1228m"),
        (" 24576 ", "0.25", "6144m"),
    ],
)
def test_the_limit_is_the_devices_memory_times_the_portion_in_whole_mib(
    memory: str, portion: str, limit: str
) -> None:
    assert hami.memory_limit("n0", {LABEL: memory}, portion) == limit


def test_the_limit_of_a_gpu_memory_pod_follows_its_rounded_portion() -> None:
    share = gpu_sharing_plan.share_from_annotations({keys.GPU_MEMORY: "4096"}, 15360)
    assert share is not None
    assert hami.limit_data("n0", {LABEL: "15360"}, gpu_sharing.gpu_portion(share)) == {
        "CUDA_DEVICE_MEMORY_LIMIT": "4147m"
    }


@pytest.mark.parametrize(
    ("labels", "portion", "said"),
    [
        ({}, "0.50", "missing"),
        ({LABEL: ""}, "0.50", "positive whole number"),
        ({LABEL: "80Gi"}, "0.50", "positive whole number"),
        ({LABEL: "0"}, "0.50", "positive whole number"),
        ({LABEL: "-1"}, "0.50", "positive whole number"),
        ({LABEL: "1.5"}, "0.50", "positive whole number"),
        ({LABEL: "1" * 40}, "0.50", "positive whole number"),
        ({LABEL: "81920"}, "0.00", "no memory at all"),
        ({LABEL: "81920"}, "abc", "no memory at all"),
        ({LABEL: "81920"}, "1.50", "no memory at all"),
        ({LABEL: "100"}, "0.001", "no memory at all"),
    ],
)
def test_an_unknown_device_memory_is_an_error_naming_the_node_and_its_label(
    labels: dict[str, str], portion: str, said: str
) -> None:
    with pytest.raises(InvalidObject) as raised:
        hami.memory_limit("gpu-7", labels, portion)
    assert (raised.value.kind, raised.value.name) == ("Node", "gpu-7")
    assert raised.value.field == f"metadata.labels[{LABEL}]"
    assert said in str(raised.value)
    assert "gpu-7" in hami.limit_unknown_message(raised.value)


@given(label=st.text(max_size=24), portion=st.text(max_size=8))
def test_any_label_and_portion_give_a_limit_or_an_error_naming_the_node(label: str, portion: str) -> None:
    outcome: str | InvalidObject
    try:
        outcome = hami.memory_limit("n0", {LABEL: label}, portion)
    except InvalidObject as exc:
        outcome = exc
    if isinstance(outcome, InvalidObject):
        assert (outcome.kind, outcome.name) == ("Node", "n0")
    else:
        assert outcome.endswith("m")
        assert 0 < int(outcome[:-1]) <= int(label)


def test_the_binder_option_is_off_by_default_and_reaches_the_reservation_settings() -> None:
    assert parse_options({}).reservations().hami_core is False
    assert parse_options({"hami_core_enabled": "true"}).reservations().hami_core is True


@pytest.mark.parametrize("value", ["false", "true"])
def test_one_value_in_kairos_env_switches_the_state_webhook_and_the_binder_in_deploy_base(value: str) -> None:
    objects = deploy.base()
    env = {**deploy.config_map_data(objects, "kairos-env"), "KAIROS_HAMI_CORE_ENABLED": value}
    assert deploy.config_map_data(objects, "kairos-env")["KAIROS_HAMI_CORE_ENABLED"] == "false"
    assert deploy.config_map_data(objects, "kairos-env")["KAIROS_BLOCK_NVIDIA_VISIBLE_DEVICES"] == "false"
    options = {
        key: re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), text)
        for key, text in deploy.set_options(deploy.find(objects, "Deployment", "kairos-binder")).items()
    }
    assert parse_options(options).hami_core_enabled is (value == "true")


# --- the admission's reference -------------------------------------------------------------------------------
def pod_doc(containers: list[dict[str, Any]], annotations: dict[str, str]) -> dict[str, Any]:
    return pod_manifest(
        "p", "team", annotations={keys.GPU_FRACTION: "0.5", **annotations}, containers=containers
    )


def admitted(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod as stored after the webhook's sharing patch and the limit's."""
    pod = wire.convert(wire.Pod, doc)
    patch = gpu_sharing.admission_patch(pod, "abc2def")
    patch += gpu_sharing.memory_limit_patch(pod, gpu_sharing.configmap_prefix(pod, "abc2def"))
    stored: dict[str, Any] = json_patch(copy.deepcopy(doc), patch)
    return stored


@pytest.mark.parametrize(
    ("containers", "annotations", "where"),
    [
        ([{"name": "main"}], {}, ("containers", 0)),
        ([{"name": "main", "env": [{"name": "PATH", "value": "/bin"}]}], {}, ("containers", 0)),
        (
            [{"name": "main", "env": [{"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "999g"}]}],
            {},
            ("containers", 0),
        ),
        (
            [{"name": "side"}, {"name": "main"}],
            {gpu_sharing.CONTAINER_NAME_ANNOTATION: "main"},
            ("containers", 1),
        ),
    ],
    ids=["no-env", "other-env", "own-limit-replaced", "named-container"],
)
def test_the_fraction_container_takes_the_limit_from_its_capabilities_configmap_optionally(
    containers: list[dict[str, Any]], annotations: dict[str, str], where: tuple[str, int]
) -> None:
    stored = admitted(pod_doc(containers, annotations))
    container = stored["spec"][where[0]][where[1]]
    limits = [e for e in container["env"] if e["name"] == gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT]
    visible = next(e for e in container["env"] if e["name"] == gpu_sharing.NVIDIA_VISIBLE_DEVICES)
    assert limits == [
        {
            "name": gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT,
            "valueFrom": {
                "configMapKeyRef": {
                    "name": visible["valueFrom"]["configMapKeyRef"]["name"],
                    "key": gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT,
                    "optional": True,
                }
            },
        }
    ]
    others = [c for c in stored["spec"]["containers"] if c is not container]
    assert all(gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT not in str(c) for c in others)
