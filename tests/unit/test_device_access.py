"""Device access at admission (`services.state.webhook.device_access`, the webhook's `block_nvidia_visible_devices`,
KAI v0.17's deviceaccess plugin): a container that asks for a GPU may set NVIDIA_VISIBLE_DEVICES only to
void or none, else the pod is refused naming it; a container that asks for none is given void; a fractional
pod's fraction container keeps its ConfigMap's variable. The webhook answers a refusal with allowed=false."""

from __future__ import annotations

import copy
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.service import StateOptions
from services.state.webhook import admission_review, device_access
from services.state.webhook.admission_review import AdmissionRequest, request_of
from services.state.webhook.device_access import DeviceAccessRefused, refusal, void_patch
from services.state.webhook.webhook import AdmissionServer, WebhookOptions
from shared.bus.connection import Bus
from shared.bus.service import ServiceConfig, ServiceContext
from shared.errors import ConfigError
from shared.kube import gpu_sharing, keys, wire
from shared.kubeapi.client import Kube
from tests.builders import pod_manifest
from tools.kubesim.patch import json_patch

VISIBLE = "NVIDIA_VISIBLE_DEVICES"
FROM_CONFIGMAP = {"configMapKeyRef": {"name": "mine", "key": VISIBLE}}
FROM_FIELD = {"fieldRef": {"fieldPath": "metadata.annotations['devices']"}}


def container(name: str, *, gpus: str | None = None, mig: str | None = None, **env: Any) -> dict[str, Any]:
    """A container; `gpus`/`mig` ask for whole GPUs or a MIG device; `env` entries by name: a string is a
    value, a dict a valueFrom."""
    out: dict[str, Any] = {"name": name, "image": "x"}
    limits = {}
    if gpus is not None:
        limits[keys.NVIDIA_GPU] = gpus
    if mig is not None:
        limits["nvidia.com/mig-3g.20gb"] = mig
    if limits:
        out["resources"] = {"limits": limits}
    if env:
        out["env"] = [
            {"name": k, "valueFrom": v} if isinstance(v, dict) else {"name": k, "value": v}
            for k, v in env.items()
        ]
    return out


def pod_doc(
    *containers: dict[str, Any],
    inits: tuple[dict[str, Any], ...] = (),
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    spec: dict[str, Any] = {"initContainers": list(inits)} if inits else {}
    return pod_manifest("train", "team", annotations=annotations, containers=list(containers), **spec)


def wire_pod(doc: dict[str, Any]) -> wire.Pod:
    return wire.convert(wire.Pod, doc)


def voided(doc: dict[str, Any]) -> dict[str, Any]:
    """What the API server stores after the void patch."""
    stored: dict[str, Any] = json_patch(copy.deepcopy(doc), void_patch(wire_pod(doc)))
    return stored


def visible_of(doc: dict[str, Any]) -> dict[str, list[Any]]:
    """Each container's NVIDIA_VISIBLE_DEVICES entries (value, or the valueFrom), by container name."""
    out: dict[str, list[Any]] = {}
    for c in (*doc["spec"].get("initContainers", ()), *doc["spec"]["containers"]):
        out[c["name"]] = [
            e.get("value", e.get("valueFrom")) for e in c.get("env") or () if e["name"] == VISIBLE
        ]
    return out


# --- refusal ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("value", "refused"),
    [
        ("void", False),
        ("none", False),
        ("", False),
        ("all", True),
        ("0", True),
        ("1,2", True),
        ("GPU-8d8e5c6c-0d21-4c6b-9b8e-3f4f5e6a7b8c", True),
        ("VOID", True),
        (" none", True),
        (FROM_CONFIGMAP, True),
        (FROM_FIELD, True),
    ],
)
def test_a_gpu_container_may_set_nvidia_visible_devices_only_to_void_or_none(
    value: Any, refused: bool
) -> None:
    pod = wire_pod(pod_doc(container("main", gpus="1", **{VISIBLE: value})))
    problem = refusal(pod)
    assert (problem is not None) is refused
    if problem is not None:
        assert problem.kind == "Pod"
        assert problem.name == "team/train"
        assert problem.field == "spec.containers[0].env[0]"
        assert "container 'main'" in str(problem)
        assert ("valueFrom" in str(problem)) is isinstance(value, dict)


@pytest.mark.parametrize(
    ("doc", "field", "name"),
    [
        (pod_doc(container("main", mig="1", **{VISIBLE: "all"})), "spec.containers[0].env[0]", "main"),
        (
            pod_doc(container("main"), inits=(container("fetch", gpus="1", PATH="/bin", **{VISIBLE: "3"}),)),
            "spec.initContainers[0].env[1]",
            "fetch",
        ),
        (
            pod_doc(container("cpu", **{VISIBLE: "all"}), container("gpu", gpus="2", **{VISIBLE: "all"})),
            "spec.containers[1].env[0]",
            "gpu",
        ),
        (
            # The fraction container setting it itself: held before, refused with the option.
            pod_doc(container("main", **{VISIBLE: "void"}), annotations={keys.GPU_FRACTION: "0.5"}),
            "spec.containers[0].env[0]",
            "main",
        ),
        (
            pod_doc(
                container("main"),
                inits=(container("warm", **{VISIBLE: "all"}),),
                annotations={keys.GPU_MEMORY: "4096", gpu_sharing.CONTAINER_NAME_ANNOTATION: "warm"},
            ),
            "spec.initContainers[0].env[0]",
            "warm",
        ),
    ],
    ids=["mig", "init-container", "second-container", "fraction-container", "fraction-init-container"],
)
def test_a_refusal_names_the_pod_the_container_and_its_env_entry(
    doc: dict[str, Any], field: str, name: str
) -> None:
    problem = refusal(wire_pod(doc))
    assert problem is not None
    assert (problem.name, problem.field) == ("team/train", field)
    assert f"container {name!r}" in str(problem)


@pytest.mark.parametrize(
    "doc",
    [
        pod_doc(container("main", **{VISIBLE: "all"})),
        pod_doc(container("main", gpus="0", **{VISIBLE: FROM_CONFIGMAP})),
        pod_doc(container("main", gpus="1"), container("side", **{VISIBLE: "0"})),
        pod_doc(
            container("main", gpus="1", **{VISIBLE: "none"}), inits=(container("i", **{VISIBLE: "all"}),)
        ),
    ],
    ids=["cpu-only", "zero-gpus", "cpu-sidecar", "cpu-init-container"],
)
def test_a_container_that_asks_for_no_gpu_is_voided_never_refused(doc: dict[str, Any]) -> None:
    assert refusal(wire_pod(doc)) is None
    before, after = visible_of(doc), visible_of(voided(doc))
    pod = wire_pod(doc)
    for c in (*pod.spec.init_containers, *pod.spec.containers):
        assert after[c.name] == (before[c.name] if device_access.requests_gpu(c) else ["void"])


def test_a_fractional_pods_admitted_environment_is_not_refused() -> None:
    doc = pod_doc(container("main"), container("side"), annotations={keys.GPU_FRACTION: "0.5"})
    admitted = json_patch(doc, gpu_sharing.admission_patch(wire_pod(doc), "abc2def"))
    assert refusal(wire_pod(admitted)) is None


# --- voiding -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            pod_doc(container("a"), container("b"), inits=(container("i"),)),
            {"i": ["void"], "a": ["void"], "b": ["void"]},
        ),
        (
            pod_doc(container("a", **{VISIBLE: "7"}), container("b", PATH="/bin")),
            {"a": ["void"], "b": ["void"]},
        ),
        (pod_doc(container("gpu", gpus="1"), container("side")), {"gpu": [], "side": ["void"]}),
        (pod_doc(container("gpu", gpus="1"), inits=(container("i"),)), {"i": ["void"], "gpu": []}),
        (pod_doc(container("mig", mig="1")), {"mig": []}),
        (pod_doc(container("a", **{VISIBLE: FROM_FIELD})), {"a": ["void"]}),
        (pod_doc(container("a", **{VISIBLE: "none"})), {"a": ["void"]}),
        (pod_doc(container("main"), annotations={keys.GPU_FRACTION: "0.5"}), {"main": []}),
        (
            pod_doc(container("main"), container("side"), annotations={keys.GPU_FRACTION: "0.5"}),
            {"main": [], "side": ["void"]},
        ),
        (
            pod_doc(
                container("main"),
                inits=(container("warm"),),
                annotations={keys.GPU_FRACTION: "0.5", gpu_sharing.CONTAINER_NAME_ANNOTATION: "warm"},
            ),
            {"warm": [], "main": ["void"]},
        ),
    ],
    ids=[
        "cpu-pod",
        "own-value-replaced",
        "gpu-with-sidecar",
        "gpu-with-init",
        "mig",
        "value-from-replaced",
        "none-becomes-void",
        "fraction-container-exempt",
        "fraction-sidecar",
        "fraction-init-container",
    ],
)
def test_containers_that_ask_for_no_gpu_get_void(doc: dict[str, Any], expected: dict[str, list[str]]) -> None:
    assert visible_of(voided(doc)) == expected


def test_voiding_twice_changes_nothing_so_each_webhook_replica_may_see_the_pod() -> None:
    once = voided(pod_doc(container("a", **{VISIBLE: "all"}), container("b"), inits=(container("i"),)))
    assert void_patch(wire_pod(once)) == []


def test_a_container_setting_the_variable_twice_gets_void_in_each_entry() -> None:
    doc = pod_doc(container("a"))
    doc["spec"]["containers"][0]["env"] = [
        {"name": VISIBLE, "value": "void"},
        {"name": VISIBLE, "value": "all"},
    ]
    assert visible_of(voided(doc)) == {"a": ["void", "void"]}


# --- hostile input -------------------------------------------------------------------------------------------
_TEXT = st.text(max_size=12)
_ENV = st.fixed_dictionaries(
    {"name": st.one_of(st.just(VISIBLE), _TEXT)},
    optional={
        "value": st.one_of(st.sampled_from(["void", "none", "all", "", "0"]), _TEXT),
        "valueFrom": st.sampled_from([FROM_CONFIGMAP, FROM_FIELD, {}]),
    },
)
_CONTAINER = st.fixed_dictionaries(
    {"name": _TEXT, "env": st.lists(_ENV, max_size=4)},
    optional={
        "resources": st.fixed_dictionaries(
            {},
            optional={
                "limits": st.dictionaries(
                    st.sampled_from([keys.NVIDIA_GPU, "nvidia.com/mig-1g.5gb", "cpu"]),
                    st.one_of(st.sampled_from(["0", "1", "2"]), _TEXT),
                    max_size=2,
                ),
            },
        )
    },
)


@settings(max_examples=200, deadline=None)
@given(
    containers=st.lists(_CONTAINER, min_size=1, max_size=3),
    inits=st.lists(_CONTAINER, max_size=2),
    fractional=st.booleans(),
)
def test_hostile_environments_never_crash_and_a_refusal_names_its_container(
    containers: list[dict[str, Any]], inits: list[dict[str, Any]], fractional: bool
) -> None:
    doc = pod_doc(
        *containers, inits=tuple(inits), annotations={keys.GPU_FRACTION: "0.5"} if fractional else None
    )
    pod = wire_pod(doc)
    problem = refusal(pod)
    if problem is not None:
        kind, _, rest = problem.field.partition("[")
        index = int(rest.split("]")[0])
        named = (inits if kind == "spec.initContainers" else containers)[index]["name"]
        assert f"container {named!r}" in str(problem)
    stored = json_patch(copy.deepcopy(doc), void_patch(pod))
    again = wire_pod(stored)
    assert void_patch(again) == []
    assert (refusal(again) is None) is (problem is None)


# --- the webhook ---------------------------------------------------------------------------------------------
def server(**options: Any) -> AdmissionServer:
    # No owner or PodGroup is read for these pods: no API server and no bus are needed.
    ctx = ServiceContext("state", ServiceConfig(), cast(Bus, None))
    return AdmissionServer(ctx, cast(Kube, None), WebhookOptions(port=0, **options))


def creation(doc: dict[str, Any]) -> AdmissionRequest:
    return request_of("r-1", "CREATE", "team", obj=doc)


async def test_the_webhook_refuses_only_with_the_option_on() -> None:
    doc = pod_doc(container("main", gpus="1", **{VISIBLE: "all"}), container("side"))
    patch, _ = await server().decide(creation(doc))
    assert patch is None
    with pytest.raises(DeviceAccessRefused) as refused:
        await server(block_nvidia_visible_devices=True).decide(creation(doc))
    assert "container 'main'" in str(refused.value)
    answer = admission_review.refusal_response("r-1", str(refused.value))["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert "container 'main'" in answer["status"]["message"]


async def test_the_webhook_voids_beside_the_sharing_environment_and_the_memory_limit() -> None:
    doc = pod_doc(container("main"), container("side"), annotations={keys.GPU_FRACTION: "0.5"})
    patch, warning = await server(block_nvidia_visible_devices=True, hami_core=True).decide(creation(doc))
    assert warning == ""
    assert patch is not None
    stored = json_patch(copy.deepcopy(doc), patch)
    assert visible_of(stored)["side"] == ["void"]
    main = stored["spec"]["containers"][0]
    refs = {e["name"]: e["valueFrom"]["configMapKeyRef"] for e in main["env"]}
    assert refs[VISIBLE]["name"] == refs[gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT]["name"]
    assert refs[gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT]["optional"] is True
    assert stored["spec"]["runtimeClassName"] == "nvidia"


async def test_without_the_options_a_pod_is_admitted_as_before() -> None:
    doc = pod_doc(
        container("main"), container("side", **{VISIBLE: "all"}), annotations={keys.GPU_FRACTION: "0.5"}
    )
    patch, _ = await server().decide(creation(doc))
    assert patch is not None
    stored = json_patch(copy.deepcopy(doc), patch)
    assert visible_of(stored)["side"] == ["all"]
    assert all(
        e["name"] != gpu_sharing.CUDA_DEVICE_MEMORY_LIMIT for e in stored["spec"]["containers"][0]["env"]
    )


# --- the state options ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("option", ["block_nvidia_visible_devices", "hami_core_enabled"])
def test_the_state_switches_are_off_by_default_and_need_the_webhook(option: str) -> None:
    webhook = {"source": "kube", "webhook_port": "9443"}
    assert getattr(StateOptions.parse(webhook), option) is False
    assert getattr(StateOptions.parse({**webhook, option: "true"}), option) is True
    with pytest.raises(ConfigError, match=f"option '{option}': needs 'webhook_port'"):
        StateOptions.parse({"source": "kube", option: "true"})
    with pytest.raises(ConfigError, match=f"option '{option}': expected true or false, got 'maybe'"):
        StateOptions.parse({**webhook, option: "maybe"})
