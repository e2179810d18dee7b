"""Stages with dependencies against the simulated API server: the state service's admission webhook gates
the pods of a Job that waits for another, its podgroup stays out of KV while it waits, and once the Job it
names completes the gate keeper lifts the gate and the podgroup is mirrored. A pod created while the
webhook is unreachable is admitted ungated and still waits.

Drives the state service's Kubernetes owner (`services.state.sources.kube_source.KubeOwner`) and its webhook
(`services.state.webhook.webhook.AdmissionServer`) with a real nats-server and `tools.kubesim`, which calls the
webhook over HTTP as a MutatingWebhookConfiguration says, as the real API server does.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from cryptography import x509

from services.state.sources.kube_source import KubeOwner, KubeSourceOptions
from services.state.webhook.webhook import PATH, AdmissionServer, WebhookOptions
from shared.bus.connection import Bus
from shared.bus.replica import StateReplica
from shared.bus.service import ServiceConfig, ServiceContext
from shared.contracts import subjects as s
from shared.kube.scheduling_gates import GATE, webhook_configuration
from shared.kubeapi.client import Kube, connect
from shared.kubeapi.paths import create_object, raw_call
from tests.integration.kubectl_helpers import running_kubesim
from tests.integration.test_nats_auth import throwaway_pki
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0
"""Generous: the machine running the tests may be loaded."""


@dataclass
class Stack:
    kube: Kube
    owner: KubeOwner
    replica: StateReplica
    ctx: ServiceContext
    webhook: AdmissionServer
    sim: KubeSim


@pytest.fixture
async def stack(bus: Bus, tmp_path: Path) -> AsyncIterator[Stack]:
    async with running_kubesim(
        tmp_path,
        options=SimOptions(run_delay=0.0, seed=7),
        manifests=(REPO / "examples" / "kai" / "queues.yaml",),
    ) as sim:
        kubeconfig = str(tmp_path / "kubeconfig")
        ctx = ServiceContext(service="state", config=ServiceConfig(replica="state-0"), bus=bus)
        replica = StateReplica(bus)
        await replica.start()
        kube = await connect(kubeconfig)
        webhook = AdmissionServer(ctx, kube, WebhookOptions(port=0, host="127.0.0.1"))
        await webhook.start()
        await create_object(kube, webhook_configuration([f"http://127.0.0.1:{webhook.port}{PATH}"]))
        owner = KubeOwner(ctx, replica, kubeconfig, KubeSourceOptions(debounce=0.01, problem_settle=0.5))
        await owner.start()
        try:
            yield Stack(kube, owner, replica, ctx, webhook, sim)
        finally:
            await owner.stop()
            await webhook.stop()
            await kube.close()
            await replica.stop()


def job(name: str, *, after: str = "", pods: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "labels": {"kai.scheduler/queue": "default-queue"},
    }
    if after:
        meta["annotations"] = {"kairos.io/after": after}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta,
        "spec": {
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "template": {
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "x", "resources": {"requests": {"cpu": "1"}}}],
                }
            },
        },
    }


async def until(what: str, check: Callable[[], Awaitable[Any]]) -> Any:
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        result = await check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"{what} within {WAIT:.0f} s")
        await asyncio.sleep(0.05)


async def pods_of(stack: Stack, job_name: str) -> list[dict[str, Any]]:
    body = await stack.kube.call(
        "list pods",
        raw_call,
        stack.kube,
        "GET",
        f"/api/v1/namespaces/default/pods?labelSelector=job-name={job_name}",
    )
    items: list[dict[str, Any]] = json.loads(body)["items"]
    return items


def gates(pod: dict[str, Any]) -> list[str]:
    return [g["name"] for g in pod["spec"].get("schedulingGates") or ()]


def podgroups_in_kv(stack: Stack) -> dict[str, Any]:
    return {key: record for key, record in stack.replica.records.items() if key.startswith("podgroup.")}


async def finish(stack: Stack, pod: dict[str, Any], phase: str) -> None:
    """What the kubelet reports when the container exits."""
    await stack.kube.call(
        "finish pod",
        stack.kube.core.patch_namespaced_pod_status,
        pod["metadata"]["name"],
        "default",
        {"status": {"phase": phase}},
        _content_type="application/merge-patch+json",
    )


async def test_a_waiting_stage_is_gated_held_and_released_when_its_dependency_completes(stack: Stack) -> None:
    await create_object(stack.kube, job("prep"))
    await create_object(stack.kube, job("train", after="prep", pods=2))

    trainers = await until("two training pods", lambda: _at_least(stack, "train", 2))
    assert all(gates(p) == [GATE] for p in trainers)
    preppers = await until("the prep pod bound by nobody yet", lambda: _at_least(stack, "prep", 1))
    assert gates(preppers[0]) == []

    async def train_held() -> bool:
        groups = podgroups_in_kv(stack)
        mirror = stack.owner.source.mirror if stack.owner.source else None
        return (
            mirror is not None
            and any("waiting for default/prep (pending) to succeed" in why for why in mirror.held.values())
            and any("prep" in key for key in groups)
        )

    await until("train's podgroup held while prep has not run", train_held)
    assert not any("pg-train" in key for key in podgroups_in_kv(stack))
    assert stack.ctx.counters["pods_gated"] == 2

    await finish(stack, preppers[0], "Succeeded")

    async def ungated() -> list[dict[str, Any]] | None:
        pods = await pods_of(stack, "train")
        return pods if pods and all(gates(p) == [] for p in pods) else None

    await until("the gates lifted", ungated)

    async def train_mirrored() -> bool:
        return any("pg-train" in key for key in podgroups_in_kv(stack))

    await until("train's podgroup in KV", train_mirrored)
    assert stack.ctx.counters["gates_lifted"] == 2


async def test_a_pod_created_while_the_webhook_is_down_is_not_gated_but_still_waits(stack: Stack) -> None:
    await stack.webhook.stop()  # failurePolicy Ignore: the pod is created as it is
    await create_object(stack.kube, job("load", after="extract"))
    loaders = await until("the load pod", lambda: _at_least(stack, "load", 1))
    assert gates(loaders[0]) == []
    mirror = stack.owner.source.mirror if stack.owner.source else None
    assert mirror is not None

    async def held() -> bool:
        return any("default/extract (does not exist yet)" in why for why in mirror.held.values())

    await until("load held for extract", held)
    assert s.pod_key("default", loaders[0]["metadata"]["name"]) not in stack.replica.records


async def test_a_body_that_is_not_an_admission_review_is_refused_with_the_reason(stack: Stack) -> None:
    async with aiohttp.ClientSession() as session:
        url = f"http://127.0.0.1:{stack.webhook.port}{PATH}"
        async with session.post(url, data=b'{"apiVersion": "v1", "kind": "Pod"}') as response:
            assert response.status == 400
            assert "apiVersion" in await response.text()


async def _at_least(stack: Stack, job_name: str, count: int) -> list[dict[str, Any]] | None:
    pods = await pods_of(stack, job_name)
    return pods if len(pods) >= count else None


def serial_in(pem: str) -> int:
    return int(x509.load_pem_x509_certificate(Path(pem).read_bytes()).serial_number)


async def _served_certificate_serial(port: int, ca: str) -> int:
    """The serial number of the certificate the webhook presents to a client that trusts `ca`."""
    context = ssl.create_default_context(cafile=ca)
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    try:
        der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    finally:
        writer.close()
        await writer.wait_closed()
    return int(x509.load_der_x509_certificate(der).serial_number)


async def test_the_webhook_serves_tls_and_picks_up_a_renewed_certificate(
    stack: Stack, tmp_path: Path
) -> None:
    first = throwaway_pki(tmp_path / "first")
    server = AdmissionServer(
        stack.ctx, stack.kube, WebhookOptions(port=0, host="127.0.0.1", cert=first.cert, key=first.key)
    )
    await server.start()
    try:
        served = await _served_certificate_serial(server.port, first.ca)
        assert served == serial_in(first.cert)
        assert not server.reload_certificate()  # unchanged files: nothing to do

        # cert-manager renews: new files in place of the old (a new CA here, so trust follows the files).
        renewed = throwaway_pki(tmp_path / "renewed")
        shutil.copyfile(renewed.cert, first.cert)
        shutil.copyfile(renewed.key, first.key)
        assert server.reload_certificate()
        served = await _served_certificate_serial(server.port, renewed.ca)
        assert served == serial_in(renewed.cert)
        assert stack.ctx.counters["webhook_certificate_reloads"] == 1

        # A half-written rotation is refused and the renewed pair keeps being served.
        await asyncio.to_thread(Path(first.key).write_text, "not a key")
        with pytest.raises(ssl.SSLError):
            server.reload_certificate()
        assert await _served_certificate_serial(server.port, renewed.ca) == served
    finally:
        await server.stop()
