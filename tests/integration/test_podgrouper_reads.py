"""The pod-grouper loop against the simulated API server: a plugin's reads beside the owner chain answered
from the cluster, a plugin that keeps asking refused on its pod, and pods that join a PodGroup someone
else made (KAI v0.15's externally created PodGroups).

Drives the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`, whose pod-grouper
groups the pods) with a real nats-server and `tools.kubesim`, objects written through the
kubernetes-asyncio client. Grove's CRDs (PodCliqueSet, PodGang) are served for the object read; the MPIJob
comes with kubesim's training operator, whose launcher waits for its workers (the pod-list read); the
Karta CRD and a made-up PyFlow kind for the Karta fallback grouper, whose Kartas the loop lists.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from services.state.controllers.grouping import registry
from services.state.controllers.grouping.default import default_metadata
from services.state.controllers.grouping.model import Ctx, Metadata
from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.kube import keys, wire
from shared.kubeapi.client import Kube, connect
from tests.builders import owner_reference, pod_manifest
from tests.integration.kubectl_helpers import running_kubesim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""


def crd(group: str, version: str, kind: str, scope: str = "Namespaced") -> str:
    """A schema-less CustomResourceDefinition of one kind, as YAML."""
    plural = f"{kind.lower()}s"
    return f"""\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: {plural}.{group}
spec:
  group: {group}
  scope: {scope}
  names: {{kind: {kind}, listKind: {kind}List, plural: {plural}, singular: {kind.lower()}}}
  versions:
    - name: {version}
      served: true
      storage: true
      schema:
        openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}
"""


CRDS = "---\n".join(
    (
        crd("grove.io", "v1alpha1", "PodCliqueSet"),
        crd("scheduler.grove.io", "v1alpha1", "PodGang"),
        crd("run.ai", "v1alpha1", "Karta", scope="Cluster"),
        crd("jobs.example.com", "v1", "PyFlow"),
    )
)
"""Grove's PodCliqueSet and PodGang, the Karta CRD and a made-up PyFlow kind."""


@pytest.fixture
async def kube(grouper: tuple[Kube, ServiceContext]) -> Kube:
    """A client of the cluster `grouper` runs on."""
    return grouper[0]


@pytest.fixture
async def grouper(bus: Bus, tmp_path: Path) -> AsyncIterator[tuple[Kube, ServiceContext]]:
    """A simulated cluster with KAI's queues and Grove's CRDs, and the state service's Kubernetes owner on
    it; yields a client of the cluster and the owner's service context (its counters)."""
    crds = tmp_path / "grove-crds.yaml"
    crds.write_text(CRDS)
    manifests = (crds, REPO / "examples" / "kai" / "queues.yaml")
    async with running_kubesim(tmp_path, nodes=2, manifests=manifests):
        kubeconfig = str(tmp_path / "kubeconfig")
        ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
        replica = StateReplica(bus)
        await replica.start()
        client = await connect(kubeconfig)
        owner = KubeOwner(ctx, replica, kubeconfig, KubeSourceOptions(debounce=0.01, problem_settle=0.5))
        await owner.start()
        try:
            yield client, ctx
        finally:
            await owner.stop()
            await client.close()
            await replica.stop()


async def eventually(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    """Poll `check` until it returns something truthy; fails naming `what` after `WAIT` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if loop.time() > deadline:
            pytest.fail(f"not within {WAIT:.0f} s: {what}")
        await asyncio.sleep(0.1)


async def create(kube: Kube, group: str, version: str, plural: str, body: dict[str, Any]) -> dict[str, Any]:
    raw = await kube.call(
        f"create {plural}",
        kube.custom.create_namespaced_custom_object,
        group,
        version,
        "default",
        plural,
        body,
    )
    return json.loads(raw)  # type: ignore[no-any-return]


async def create_pod(kube: Kube, body: dict[str, Any]) -> None:
    await kube.call("create pod", kube.core.create_namespaced_pod, "default", body)


async def read_pod(kube: Kube, name: str) -> dict[str, Any]:
    raw = await kube.call("read pod", kube.core.read_namespaced_pod, name, "default")
    return json.loads(raw)  # type: ignore[no-any-return]


async def podgroup(kube: Kube, name: str) -> dict[str, Any] | None:
    raw = await kube.call(
        "list podgroups",
        kube.custom.list_namespaced_custom_object,
        "scheduling.run.ai",
        "v2alpha2",
        "default",
        "podgroups",
    )
    found = [pg for pg in json.loads(raw)["items"] if pg["metadata"]["name"] == name]
    return found[0] if found else None


async def events(kube: Kube) -> list[dict[str, Any]]:
    raw = await kube.call("list events", kube.core.list_namespaced_event, "default")
    return json.loads(raw)["items"]  # type: ignore[no-any-return]


def pod(
    name: str,
    *,
    owner: dict[str, Any] | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod in `default-queue` with `labels` and `annotations`, controlled by `owner` when given."""
    owners = [] if owner is None else [owner_reference(owner)]
    labels = {keys.QUEUE_LABEL: "default-queue", **(labels or {})}
    return pod_manifest(
        name, labels=labels, annotations=annotations, owners=owners, scheduler=keys.SCHEDULER_NAME
    )


def annotation(obj: dict[str, Any], key: str) -> str | None:
    value = (obj["metadata"].get("annotations") or {}).get(key)
    return value if isinstance(value, str) else None


def condition(obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == kind), None)


# --- a plugin's reads --------------------------------------------------------------------------------------------
async def test_a_grove_pod_is_grouped_by_the_podgang_the_plugin_reads(kube: Kube) -> None:
    pcs = await create(
        kube,
        "grove.io",
        "v1alpha1",
        "podcliquesets",
        {
            "apiVersion": "grove.io/v1alpha1",
            "kind": "PodCliqueSet",
            "metadata": {"name": "serve"},
            "spec": {},
        },
    )
    refs = [{"namespace": "default", "name": n} for n in ("serve-0-prefill-0", "serve-0-prefill-1")]
    gang = await create(
        kube,
        "scheduler.grove.io",
        "v1alpha1",
        "podgangs",
        {
            "apiVersion": "scheduler.grove.io/v1alpha1",
            "kind": "PodGang",
            "metadata": {"name": "serve-0"},
            "spec": {
                "priorityClassName": "inference",
                "podgroups": [
                    {"name": "serve-0-frontend", "minReplicas": 1, "podReferences": refs[:0]},
                    {"name": "serve-0-prefill", "minReplicas": 2, "podReferences": refs},
                ],
            },
        },
    )
    for name in ("serve-0-prefill-0", "serve-0-prefill-1"):
        await create_pod(kube, pod(name, owner=pcs, labels={"grove.io/podgang": "serve-0"}))
    name = f"pg-serve-0-{gang['metadata']['uid']}"

    async def grouped() -> dict[str, Any] | None:
        first = await read_pod(kube, "serve-0-prefill-0")
        return await podgroup(kube, name) if annotation(first, keys.PODGROUP_ANNOTATION) == name else None

    group = await eventually("the Grove pod grouped by its PodGang", grouped)
    assert group["spec"]["minMember"] == 3
    assert group["spec"]["priorityClassName"] == "inference"
    assert group["metadata"]["ownerReferences"][0]["kind"] == "PodGang"
    assert [sg["name"] for sg in group["spec"]["subGroups"]] == ["serve-0-frontend", "serve-0-prefill"]
    first = await read_pod(kube, "serve-0-prefill-0")
    assert first["metadata"]["labels"][keys.SUBGROUP_LABEL] == "serve-0-prefill"


def karta_of_pyflow() -> dict[str, Any]:
    """A Karta describing the made-up PyFlow kind (one master, workers) and how to gang it."""

    def component(name: str) -> dict[str, Any]:
        return {
            "name": name,
            "ownerRef": "pyflow",
            "specDefinition": {"podTemplateSpecPath": f".spec.{name}.template"},
            "scaleDefinition": {"replicasPath": f".spec.{name}.replicas"},
            "podSelector": {"componentTypeSelector": {"keyPath": ".metadata.labels.role", "value": name}},
        }

    return {
        "apiVersion": "run.ai/v1alpha1",
        "kind": "Karta",
        "metadata": {
            "name": "pyflow",
            "labels": {
                "run.ai/karta-group": "jobs.example.com",
                "run.ai/karta-version": "v1",
                "run.ai/karta-kind": "PyFlow",
            },
        },
        "spec": {
            "structureDefinition": {
                "rootComponent": {
                    "name": "pyflow",
                    "kind": {"group": "jobs.example.com", "version": "v1", "kind": "PyFlow"},
                },
                "childComponents": [component("master"), component("worker")],
            },
            "instructions": {
                "gangScheduling": {
                    "podGroup": {
                        "name": "training",
                        "subGroups": [{"componentName": "master"}, {"componentName": "worker"}],
                    }
                }
            },
        },
    }


async def test_a_kind_no_plugin_claims_is_grouped_by_the_karta_the_loop_lists(kube: Kube) -> None:
    await kube.call(
        "create karta",
        kube.custom.create_cluster_custom_object,
        "run.ai",
        "v1alpha1",
        "kartas",
        karta_of_pyflow(),
    )
    flow = await create(
        kube,
        "jobs.example.com",
        "v1",
        "pyflows",
        {
            "apiVersion": "jobs.example.com/v1",
            "kind": "PyFlow",
            "metadata": {"name": "flow"},
            "spec": {"master": {"replicas": 1}, "worker": {"replicas": 2}},
        },
    )
    roles = {"flow-master-0": "master", "flow-worker-0": "worker", "flow-worker-1": "worker"}
    for name, role in roles.items():
        await create_pod(kube, pod(name, owner=flow, labels={"role": role}))

    async def grouped() -> dict[str, Any] | None:
        first = await read_pod(kube, "flow-worker-0")
        name = annotation(first, keys.PODGROUP_ANNOTATION)
        return None if name is None else await podgroup(kube, name)

    group = await eventually("the PyFlow's pods grouped by its Karta", grouped)
    assert group["metadata"]["ownerReferences"][0]["kind"] == "PyFlow"
    sub_groups = {sg["name"]: sg.get("minMember") for sg in group["spec"]["subGroups"]}
    assert sub_groups == {"master": 1, "worker": 2}
    worker = await read_pod(kube, "flow-worker-1")
    assert worker["metadata"]["labels"][keys.SUBGROUP_LABEL] == "worker"


async def test_a_waiting_mpijobs_plugin_lists_the_launcher_pods_before_deciding(kube: Kube) -> None:
    template = {"spec": {"schedulerName": keys.SCHEDULER_NAME, "containers": [{"name": "m", "image": "x"}]}}
    job = await create(
        kube,
        "kubeflow.org",
        "v2beta1",
        "mpijobs",
        {
            "apiVersion": "kubeflow.org/v2beta1",
            "kind": "MPIJob",
            "metadata": {"name": "pi", "labels": {keys.QUEUE_LABEL: "default-queue"}},
            "spec": {
                "launcherCreationPolicy": "WaitForWorkersReady",
                "mpiReplicaSpecs": {
                    "Launcher": {"replicas": 1, "template": template},
                    "Worker": {"replicas": 2, "template": template},
                },
            },
        },
    )
    name = f"pg-pi-{job['metadata']['uid']}"

    async def grouped() -> dict[str, Any] | None:
        return await podgroup(kube, name)

    group = await eventually("the MPIJob's workers grouped", grouped)
    # No launcher pod exists yet (its workers are not ready): the listed pods say so, the gang is the workers.
    assert group["spec"]["minMember"] == 2


async def test_a_pod_whose_plugin_keeps_asking_for_reads_is_refused_with_pod_scheduled_false(
    kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    def asking(ctx: Ctx, top: wire.Owner) -> Metadata:
        ctx.get("v1", "ConfigMap", f"another-{len(ctx.reads)}")
        return default_metadata(ctx, top, [top])

    monkeypatch.setitem(registry.PLUGINS, ("", "v1", "Pod"), ("asking", asking))
    await create_pod(kube, pod("asker"))

    async def refused() -> dict[str, Any] | None:
        scheduled = condition(await read_pod(kube, "asker"), "PodScheduled")
        return scheduled if scheduled and scheduled["status"] == "False" else None

    scheduled = await eventually("the pod refused with PodScheduled=False", refused)
    assert scheduled["reason"] == "InvalidPod"
    assert "kept asking for reads" in scheduled["message"]
    assert annotation(await read_pod(kube, "asker"), keys.PODGROUP_ANNOTATION) is None
    warnings = [
        e for e in await events(kube) if e["involvedObject"]["name"] == "asker" and e["type"] == "Warning"
    ]
    assert any("kept asking for reads" in e["message"] for e in warnings)


# --- externally created PodGroups --------------------------------------------------------------------------------
async def test_pods_join_an_external_podgroup_and_one_naming_a_missing_sub_group_is_told_why(
    kube: Kube,
) -> None:
    await create(
        kube,
        "scheduling.run.ai",
        "v2alpha2",
        "podgroups",
        {
            "apiVersion": "scheduling.run.ai/v2alpha2",
            "kind": "PodGroup",
            "metadata": {"name": "pipeline"},
            "spec": {
                "minMember": 2,
                "queue": "default-queue",
                "subGroups": [{"name": "train", "minMember": 1}, {"name": "evaluation", "minMember": 1}],
            },
        },
    )
    skip = {keys.SKIP_PODGROUPER_ANNOTATION: "true"}
    joining = {**skip, keys.PODGROUP_ANNOTATION: "pipeline"}
    await create_pod(kube, pod("train-0", labels={keys.SUBGROUP_LABEL: "train"}, annotations=joining))
    await create_pod(kube, pod("stray-0", labels={keys.SUBGROUP_LABEL: "evaluaton"}, annotations=joining))
    await create_pod(kube, pod("early-0", annotations={**skip, keys.PODGROUP_ANNOTATION: "not-yet"}))

    async def told() -> dict[str, Any] | None:
        scheduled = condition(await read_pod(kube, "stray-0"), "PodScheduled")
        return scheduled if scheduled and scheduled["status"] == "False" else None

    scheduled = await eventually("the stray pod told its sub-group does not exist", told)
    assert scheduled["reason"] == "InvalidPod"
    assert f"metadata.labels[{keys.SUBGROUP_LABEL}]" in scheduled["message"]
    assert "'evaluaton'" in scheduled["message"]
    for name in ("train-0", "early-0"):
        assert condition(await read_pod(kube, name), "PodScheduled") is None, name
    # The pod-grouper left every one of them alone: their PodGroup names are the ones written.
    assert annotation(await read_pod(kube, "train-0"), keys.PODGROUP_ANNOTATION) == "pipeline"
    assert annotation(await read_pod(kube, "early-0"), keys.PODGROUP_ANNOTATION) == "not-yet"
    assert await podgroup(kube, "not-yet") is None


# --- an owner's fault --------------------------------------------------------------------------------------------
def batch_job(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "default", "annotations": annotations},
        "spec": {
            "parallelism": 3,
            "completions": 3,
            "template": {
                "metadata": {"labels": {keys.QUEUE_LABEL: "default-queue", "job": name}},
                "spec": {
                    "schedulerName": keys.SCHEDULER_NAME,
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "x"}],
                },
            },
        },
    }


async def test_an_owners_malformed_field_is_told_on_the_owner_once_and_holds_only_its_pods(
    kube: Kube,
) -> None:
    bad = json.loads(
        await kube.request(
            "create job",
            "POST",
            "/apis/batch/v1/namespaces/default/jobs",
            batch_job("bad", {keys.BATCH_MIN_MEMBER_ANNOTATION: "many"}),
        )
    )
    await kube.request("create job", "POST", "/apis/batch/v1/namespaces/default/jobs", batch_job("good", {}))

    async def pods_of(job: str) -> list[dict[str, Any]]:
        raw = await kube.call(
            "list pods", kube.core.list_namespaced_pod, "default", label_selector=f"job={job}"
        )
        return json.loads(raw)["items"]  # type: ignore[no-any-return]

    async def held() -> list[dict[str, Any]] | None:
        pods = await pods_of("bad")
        scheduled = [condition(p, "PodScheduled") for p in pods]
        return pods if len(pods) == 3 and all(c and c["status"] == "False" for c in scheduled) else None

    for p in await eventually("the bad Job's three pods held with PodScheduled=False", held):
        assert annotation(p, keys.PODGROUP_ANNOTATION) is None
        assert (
            f"metadata.annotations[{keys.BATCH_MIN_MEMBER_ANNOTATION}]"
            in condition(p, "PodScheduled")["message"]
        )

    async def grouped() -> bool:
        return (
            all(annotation(p, keys.PODGROUP_ANNOTATION) for p in await pods_of("good"))
            and len(await pods_of("good")) == 3
        )

    await eventually("the good Job's pods grouped all the same", grouped)

    async def on_the_job() -> list[dict[str, Any]]:
        return [
            e
            for e in await events(kube)
            if e["involvedObject"].get("kind") == "Job"
            and e["involvedObject"].get("name") == "bad"
            and e["reason"] == "InvalidPod"
        ]

    told = await eventually("a Warning Event on the Job", on_the_job)
    await asyncio.sleep(1.0)  # every pod's refusal has been reported by now
    told = await on_the_job()
    assert len(told) == 1
    assert told[0]["type"] == "Warning"
    assert told[0]["involvedObject"]["uid"] == bad["metadata"]["uid"]
    assert f"metadata.annotations[{keys.BATCH_MIN_MEMBER_ANNOTATION}]" in told[0]["message"]


async def test_a_gangs_podgroup_is_created_once_for_all_the_pods_grouped_side_by_side(
    grouper: tuple[Kube, ServiceContext],
) -> None:
    kube, ctx = grouper
    await kube.request(
        "create job",
        "POST",
        "/apis/batch/v1/namespaces/default/jobs",
        {**batch_job("gang", {keys.BATCH_MIN_MEMBER_ANNOTATION: "3"})},
    )

    async def grouped() -> bool:
        raw = await kube.call(
            "list pods", kube.core.list_namespaced_pod, "default", label_selector="job=gang"
        )
        pods = json.loads(raw)["items"]
        return len(pods) == 3 and all(annotation(p, keys.PODGROUP_ANNOTATION) for p in pods)

    await eventually("the Job's three pods grouped", grouped)
    assert ctx.counters["podgroups_created"] == 1
    assert ctx.counters["podgroups_existed"] == 0
