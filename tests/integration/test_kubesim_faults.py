"""Fault injection in the simulated API server, seen from clients over HTTP: 5xx and 429 (with Retry-After)
for a fraction of a verb and resource, slow answers, dropped watches, 410 Gone to a watch resume; the plan
read, replaced and counted through `/kubesim/faults`, and the pods/binding record at `/kubesim/bindings`.
The informer (`shared.kubeapi.informer`) must come through a dropped watch and a 410 without losing an
object, and the binder's Kubernetes client must bind through 5xx and 429 answers."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import pytest

from services.binder.kube_client import KubeClusterClient
from shared.backoff import Backoff
from shared.contracts.messages import Binding
from shared.kubeapi.client import Kube
from shared.kubeapi.client import connect as kube_connect
from shared.kubeapi.informer import Informer
from tests.builders import pod_manifest
from tests.integration.kubectl_helpers import running_kubesim
from tools.kubesim.cluster import SimOptions
from tools.kubesim.faults import FaultPlan, FaultRule
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

PODS = "/api/v1/namespaces/default/pods"


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(
        tmp_path, options=SimOptions(run_delay=0.0, watch_history=1000, seed=3), bookmark_seconds=0.2
    ) as server:
        server.liveness_seconds = 0.2
        yield server


@pytest.fixture
async def http(sim: KubeSim) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=sim.url) as session:
        yield session


@pytest.fixture
async def kube(sim: KubeSim, tmp_path: Path) -> AsyncIterator[Kube]:
    client = await kube_connect(str(tmp_path / "kubeconfig"))
    try:
        yield client
    finally:
        await client.close()


def pod(name: str) -> dict[str, Any]:
    return pod_manifest(name, image="busybox")


async def set_plan(http: aiohttp.ClientSession, *rules: FaultRule, seed: int = 1) -> dict[str, Any]:
    body = msgspec.json.encode(FaultPlan(rules=rules, seed=seed))
    async with http.post("/kubesim/faults", data=body) as resp:
        assert resp.status == 200, await resp.text()
        answer: dict[str, Any] = await resp.json()
        return answer


async def create(http: aiohttp.ClientSession, name: str) -> int:
    async with http.post(PODS, data=json.dumps(pod(name))) as resp:
        await resp.read()
        return resp.status


async def test_a_fraction_of_one_verb_answers_500_and_the_rest_is_served(
    sim: KubeSim, http: aiohttp.ClientSession
) -> None:
    await set_plan(http, FaultRule(verb="create", resource="pods", fraction=0.5, status=500))
    codes = [await create(http, f"p{i}") for i in range(40)]
    failed = codes.count(500)
    assert 5 <= failed <= 35, codes  # seeded: some, not all
    assert codes.count(201) == 40 - failed
    assert len(sim.cluster.objects("pods", "default")) == 40 - failed  # a 500 created nothing
    async with http.get(PODS) as resp:  # another verb is not touched
        assert resp.status == 200
    async with http.get("/kubesim/faults") as resp:
        report = await resp.json()
    assert report["hits"] == [failed]
    assert report["injected"] == {"500": failed}


async def test_429_carries_retry_after_and_the_limit_ends_the_rule(http: aiohttp.ClientSession) -> None:
    await set_plan(http, FaultRule(verb="get", resource="nodes", status=429, retry_after=2, limit=2))
    answers = []
    for _ in range(3):
        async with http.get("/api/v1/nodes/node-0") as resp:
            answers.append((resp.status, resp.headers.get("Retry-After")))
            body = await resp.json()
    assert answers == [(429, "2"), (429, "2"), (200, None)]
    assert body["metadata"]["name"] == "node-0"


async def test_a_delay_slows_the_answer_without_changing_it(http: aiohttp.ClientSession) -> None:
    await set_plan(http, FaultRule(verb="list", resource="nodes", delay=0.5))
    started = time.monotonic()
    async with http.get("/api/v1/nodes") as resp:
        assert resp.status == 200
        assert len((await resp.json())["items"]) == 2
    assert time.monotonic() - started >= 0.5


async def test_a_bad_plan_is_refused_naming_the_rule_and_field(http: aiohttp.ClientSession) -> None:
    async with http.post("/kubesim/faults", data=b'{"rules": [{"verb": "get", "status": 410}]}') as resp:
        assert resp.status == 400
        message = (await resp.json())["message"]
    assert "$.rules[0]" in message
    assert "410" in message
    async with http.post("/kubesim/faults", data=b'{"rules": [{"fraction": 2}]}') as resp:
        assert resp.status == 400
        assert "fraction" in (await resp.json())["message"]


async def test_410_is_answered_to_a_watch_resume_only(http: aiohttp.ClientSession) -> None:
    await set_plan(http, FaultRule(verb="watch", resource="pods", status=410))
    async with http.get(PODS) as resp:
        rv = (await resp.json())["metadata"]["resourceVersion"]
    async with http.get(PODS, params={"watch": "true", "resourceVersion": rv}) as resp:
        assert resp.status == 200
        event = json.loads((await resp.read()).splitlines()[0])
    assert event["type"] == "ERROR"
    assert event["object"]["code"] == 410
    # A watch without a resourceVersion (a fresh start, no resume) is served.
    assert await create(http, "a") == 201
    async with http.get(PODS, params={"watch": "true", "timeoutSeconds": "1"}) as resp:
        first = json.loads(await resp.content.readline())
    assert first["type"] == "ADDED"
    assert first["object"]["metadata"]["name"] == "a"


async def pod_informer(kube: Kube, seen: dict[str, str]) -> Informer:
    async def on_relist(items: list[msgspec.Raw]) -> None:
        seen.clear()
        for raw in items:
            await on_change("ADDED", raw)

    async def on_change(kind: str, raw: msgspec.Raw) -> None:
        obj = msgspec.json.decode(raw)
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            seen.pop(name, None)
        else:
            seen[name] = obj["metadata"]["resourceVersion"]

    return Informer(
        kube,
        "pods",
        kube.core.list_namespaced_pod,
        on_relist,
        on_change,
        args=("default",),
        backoff=Backoff(attempts=1_000_000, base=0.05, cap=0.2),
    )


async def wait_until(condition: Any, timeout: float = 30.0, shown: Any = lambda: "") -> None:
    """Poll `condition()`; fail after `timeout` seconds with what `shown()` says."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"condition not reached {shown()}"
        await asyncio.sleep(0.05)


async def test_the_informer_resumes_after_a_dropped_watch_and_relists_after_410(
    sim: KubeSim, http: aiohttp.ClientSession, kube: Kube
) -> None:
    seen: dict[str, str] = {}
    informer = await pod_informer(kube, seen)
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        await create(http, "before")
        await wait_until(lambda: "before" in seen and len(sim._watches) == 1)
        # Dropped: the informer watches again from its resourceVersion, no relist, nothing missed.
        assert sim.drop_watches("pods") == 1
        await create(http, "after-drop")
        await wait_until(lambda: "after-drop" in seen)
        assert informer.relists == 1
        # Every resume now answers 410: the informer lists again and sees what happened meanwhile.
        await set_plan(http, FaultRule(verb="watch", resource="pods", status=410, limit=1))
        await wait_until(lambda: len(sim._watches) == 1)
        sim.drop_watches("pods")
        await create(http, "after-410")
        await wait_until(lambda: "after-410" in seen and informer.relists == 2)
        assert set(seen) == {"before", "after-drop", "after-410"}
        async with http.get("/kubesim/faults") as resp:
            injected = (await resp.json())["injected"]
        assert injected == {"dropped-watch": 2, "410": 1}
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_informer_lists_again_when_the_server_it_could_not_reach_comes_back_without_its_history(
    tmp_path: Path,
) -> None:
    """A restarted kubesim (an API server on a wiped etcd) counts resourceVersions from scratch. Once its
    counter has passed the informer's resourceVersion it accepts a watch from it, and would never send the
    objects it made below it: an informer that could not reach its server lists again instead of resuming."""
    first = KubeSim(SimOptions(run_delay=0.0, seed=3))
    port = int((await first.start()).rsplit(":", 1)[1])
    first.write_kubeconfig(tmp_path / "kubeconfig")
    second = KubeSim(SimOptions(run_delay=0.0, seed=3))
    kube = await kube_connect(str(tmp_path / "kubeconfig"))
    seen: dict[str, str] = {}
    refused = asyncio.Event()

    async def list_pods(*args: Any, **kwargs: Any) -> Any:
        try:
            return await kube.core.list_namespaced_pod(*args, **kwargs)
        except aiohttp.ClientConnectorError:
            refused.set()
            raise

    informer = await pod_informer(kube, seen)
    informer.method = list_pods
    task = asyncio.create_task(informer.run())
    try:
        await asyncio.wait_for(informer.synced.wait(), 30)
        rt = first.cluster.type_of("pods")
        for i in range(3):
            first.cluster.create(rt, "default", pod(f"old-{i}"))
        await wait_until(lambda: len(seen) == 3)
        held = int(informer.resource_version)
        await first.stop()
        await asyncio.wait_for(refused.wait(), 30)

        # Made before the server listens, so that none of them can reach the informer through a watch
        # that began earlier; most get a resourceVersion at or below the one the informer holds.
        new: set[str] = set()
        while second.cluster.store.rv <= held + 1:
            name = f"new-{len(new)}"
            second.cluster.create(rt, "default", pod(name))
            new.add(name)
        await second.start(port=port)
        await wait_until(lambda: set(seen) == new, shown=lambda: f"the informer holds {sorted(seen)}")
        assert informer.relists == 2
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await kube.close()
        await first.stop()
        await second.stop()


async def test_the_binder_binds_through_5xx_and_429_and_the_binding_record_shows_one_call(
    sim: KubeSim, http: aiohttp.ClientSession, kube: Kube
) -> None:
    await create(http, "p")
    await set_plan(
        http,
        FaultRule(verb="create", resource="pods/binding", status=503, limit=2),
        FaultRule(verb="create", resource="pods/binding", status=429, retry_after=0, limit=1),
    )
    client = KubeClusterClient(kube, backoff=Backoff(attempts=6, base=0.05, cap=0.2))
    binding = Binding(pod="default/p", namespace="default", name="p", podgroup="default/pg", node="node-1")
    await client.bind(binding)
    await client.bind(binding)  # again (a retried proposal): a 409, confirmed as ours
    async with http.get("/kubesim/bindings") as resp:
        record = await resp.json()
    assert record == {"bindings": {"default/p": ["node-1"]}, "refused": {"default/p": 1}}
    assert sim.faults.hits == [2, 1]
