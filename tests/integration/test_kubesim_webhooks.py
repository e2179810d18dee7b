"""Admission webhooks in the simulated API server, against a real webhook server (aiohttp, on a free loopback
port): kubesim POSTs an AdmissionReview to each matching Mutating/ValidatingWebhookConfiguration, applies
a mutating webhook's JSON patch, fails the request on a denial or, with failurePolicy Fail, on a webhook it
cannot call; and it holds pods with scheduling gates as the real server does (Kairos's `kairos.io/after`)."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from tests.integration.kubectl_helpers import kubectl, running_kubesim
from tests.integration.test_nats_auth import throwaway_pki
from tools.kubesim.cluster import SimOptions
from tools.kubesim.server import KubeSim

pytestmark = pytest.mark.integration

Obj = dict[str, Any]
GATE = "kairos.io/after"
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
MUTATING = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"
VALIDATING = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"


# --- a real webhook server ---------------------------------------------------------------------------------
Answer = Callable[[Obj], Obj]
"""From the AdmissionReview request to the response fields besides uid (allowed, patch, status, ...)."""


def allow(_: Obj) -> Obj:
    return {"allowed": True}


def add_gate(request: Obj) -> Obj:
    gates = (request["object"].get("spec") or {}).get("schedulingGates")
    op: Obj = (
        {"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}
        if gates
        else {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}
    )
    return {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps([op]).encode()).decode(),
    }


@dataclass
class Hooks:
    """The webhook server: each path answers with its `Answer`; every review received is kept."""

    url: str = ""
    answers: dict[str, Answer] = field(default_factory=dict)
    delay: dict[str, float] = field(default_factory=dict)
    received: list[tuple[str, Obj]] = field(default_factory=list)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    """Set to end the delays early (a test ends with no handler left waiting)."""
    in_flight: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)
    """Set whenever no delayed answer is in flight."""

    def requests(self, path: str) -> list[Obj]:
        return [review["request"] for p, review in self.received if p == path]

    async def handle(self, request: web.Request) -> web.Response:
        review = await request.json()
        path = request.path
        self.received.append((path, {**review, "query": dict(request.query)}))
        if path in self.delay:
            self.in_flight += 1
            self.idle.clear()
            try:
                async with asyncio.timeout(self.delay[path]):
                    await self.release.wait()
            except TimeoutError:
                pass
            finally:
                self.in_flight -= 1
                if not self.in_flight:
                    self.idle.set()
        answer = self.answers.get(path, allow)(review["request"])
        response = {"uid": review["request"]["uid"], **answer}
        return web.json_response(
            {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}
        )


async def serve(hooks: Hooks, context: ssl.SSLContext | None = None) -> web.AppRunner:
    app = web.Application()
    app.router.add_post("/{tail:.*}", hooks.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.5)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = runner.addresses[0][1]
    hooks.url = f"{'https' if context else 'http'}://127.0.0.1:{port}"
    return runner


@pytest.fixture
async def hooks() -> AsyncIterator[Hooks]:
    out = Hooks()
    runner = await serve(out)
    try:
        yield out
    finally:
        await runner.cleanup()


@pytest.fixture
async def sim(tmp_path: Path) -> AsyncIterator[KubeSim]:
    async with running_kubesim(tmp_path, options=SimOptions(run_delay=0.0, seed=5)) as server:
        yield server


@pytest.fixture
async def http(sim: KubeSim) -> AsyncIterator[Api]:
    async with aiohttp.ClientSession() as session:
        yield Api(session, sim.url)


class Api:
    """Raw requests to kubesim: (status code, JSON body), so a test reads the Status of a refusal."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session = session
        self.base = base

    async def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> tuple[int, Obj]:
        data = json.dumps(body).encode() if body is not None else None
        async with self.session.request(
            method, self.base + path, data=data, headers={"Content-Type": content_type}
        ) as response:
            return response.status, await response.json()


def webhook(name: str, url: str, **extra: Any) -> Obj:
    out: Obj = {
        "name": name,
        "clientConfig": {"url": url},
        "rules": [
            {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}
        ],
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
    }
    out.update(extra)
    return out


def configuration(name: str, *hooks: Obj, validating: bool = False) -> Obj:
    kind = "ValidatingWebhookConfiguration" if validating else "MutatingWebhookConfiguration"
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name},
        "webhooks": list(hooks),
    }


def pod(name: str = "", *, generate: str = "", labels: dict[str, str] | None = None, **spec: Any) -> Obj:
    md: Obj = {"name": name} if name else {"generateName": generate}
    if labels:
        md["labels"] = labels
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": md,
        "spec": {
            "schedulerName": "kai-scheduler",
            "containers": [{"name": "main", "image": "busybox"}],
            **spec,
        },
    }


PODS = "/api/v1/namespaces/default/pods"


async def register(http: Api, config: Obj, *, validating: bool = False) -> Obj:
    config = {
        **config,
        "kind": "ValidatingWebhookConfiguration" if validating else "MutatingWebhookConfiguration",
    }
    status, body = await http.call("POST", VALIDATING if validating else MUTATING, config)
    assert status == 201, body
    return body


# --- mutating: the gate -------------------------------------------------------------------------------------
async def test_a_mutating_webhook_adds_a_scheduling_gate_that_holds_the_pod(
    sim: KubeSim, hooks: Hooks, http: Api
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    await register(
        http,
        configuration("kairos", webhook("after.kairos.test", hooks.url + "/mutate-pods", timeoutSeconds=5)),
    )

    status, created = await http.call("POST", PODS, pod(generate="stage-"))
    assert status == 201, created
    assert created["spec"]["schedulingGates"] == [{"name": GATE}]
    name = created["metadata"]["name"]
    assert name.startswith("stage-")
    # Read back: stored with the gate, held as the real server holds it.
    status, stored = await http.call("GET", f"{PODS}/{name}")
    assert stored["spec"]["schedulingGates"] == [{"name": GATE}]
    scheduled = [c for c in stored["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled[0]["status"] == "False"
    assert scheduled[0]["reason"] == "SchedulingGated"

    [request] = hooks.requests("/mutate-pods")
    assert request["operation"] == "CREATE"
    assert request["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert request["resource"] == {"group": "", "version": "v1", "resource": "pods"}
    assert request["namespace"] == "default"
    # As on a real server, a generateName pod has no name nor uid yet when admission sees it.
    assert request["name"] == ""
    assert "uid" not in request["object"]["metadata"]
    assert request["object"]["spec"]["schedulerName"] == "kai-scheduler"
    assert request["oldObject"] is None
    assert request["dryRun"] is False
    assert request["userInfo"]["username"]
    assert hooks.received[0][1]["query"] == {"timeout": "5s"}


async def test_a_gated_pod_cannot_be_bound_until_the_gate_is_removed(
    sim: KubeSim, hooks: Hooks, http: Api
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    await register(http, configuration("kairos", webhook("after.kairos.test", hooks.url + "/mutate-pods")))
    status, created = await http.call("POST", PODS, pod("p"))
    assert status == 201, created
    node = sim.cluster.objects("nodes")[0]["metadata"]["name"]
    binding = {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": {"name": "p"},
        "target": {"kind": "Node", "name": node},
    }

    status, refused = await http.call("POST", f"{PODS}/p/binding", binding)
    assert status == 500
    assert refused["message"] == "pod p has non-empty .spec.schedulingGates"
    assert "nodeName" not in sim.cluster.find("pods", "default", "p")["spec"]

    # Adding a gate after creation is refused; removing it (what Kairos does when the dependencies
    # succeeded) is not, and then the pod binds.
    status, body = await http.call(
        "PATCH",
        f"{PODS}/p",
        [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": "other"}}],
        JSON_PATCH,
    )
    assert status == 422, body
    status, body = await http.call(
        "PATCH", f"{PODS}/p", [{"op": "remove", "path": "/spec/schedulingGates/0"}], JSON_PATCH
    )
    assert status == 200, body
    status, body = await http.call("POST", f"{PODS}/p/binding", binding)
    assert status == 201, body
    assert sim.cluster.find("pods", "default", "p")["spec"]["nodeName"] == node


async def test_a_pod_created_with_a_node_and_a_gate_is_refused(http: Api) -> None:
    status, body = await http.call("POST", PODS, pod("p", nodeName="n0", schedulingGates=[{"name": GATE}]))
    assert status == 422
    assert "spec.nodeName" in body["message"]
    assert "schedulingGates" in body["message"]


async def test_a_webhook_may_not_rename_the_object(hooks: Hooks, http: Api) -> None:
    rename = [{"op": "replace", "path": "/metadata/name", "value": "other"}]
    hooks.answers["/rename"] = lambda _: {
        "allowed": True,
        "patchType": "JSONPatch",
        "patch": base64.b64encode(json.dumps(rename).encode()).decode(),
    }
    await register(http, configuration("c", webhook("rename.kairos.test", hooks.url + "/rename")))
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 500
    assert 'failed calling webhook "rename.kairos.test"' in body["message"]
    assert "metadata.name" in body["message"]


# --- denial, failure policies -------------------------------------------------------------------------------
async def test_a_denial_fails_the_request_with_the_webhooks_code_and_message(hooks: Hooks, http: Api) -> None:
    hooks.answers["/deny"] = lambda _: {
        "allowed": False,
        "status": {"code": 403, "message": "stage not ready"},
    }
    hooks.answers["/deny-plain"] = lambda _: {"allowed": False}
    await register(
        http, configuration("v", webhook("deny.kairos.test", hooks.url + "/deny")), validating=True
    )

    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 403
    assert body["message"] == 'admission webhook "deny.kairos.test" denied the request: stage not ready'
    status, _ = await http.call("GET", f"{PODS}/p")
    assert status == 404

    await http.call("DELETE", f"{VALIDATING}/v")
    await register(http, configuration("m", webhook("plain.kairos.test", hooks.url + "/deny-plain")))
    status, body = await http.call("POST", PODS, pod("q"))
    assert status == 400
    assert body["message"] == 'admission webhook "plain.kairos.test" denied the request without explanation'


async def test_a_webhook_that_is_down_fails_the_request_only_under_failure_policy_fail(http: Api) -> None:
    # A port nobody listens on: bound, then closed.
    runner = await serve(Hooks())
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/gone"
    await runner.cleanup()

    await register(http, configuration("strict", webhook("strict.kairos.test", url, failurePolicy="Fail")))
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 500
    assert body["reason"] == "InternalError"
    assert 'failed calling webhook "strict.kairos.test"' in body["message"]

    await http.call("DELETE", f"{MUTATING}/strict")
    await register(
        http, configuration("lenient", webhook("lenient.kairos.test", url, failurePolicy="Ignore"))
    )
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 201, body


async def test_a_slow_webhook_times_out_after_its_timeout_seconds(hooks: Hooks, http: Api) -> None:
    hooks.answers["/slow"] = add_gate
    hooks.delay["/slow"] = 4.0
    await register(
        http, configuration("slow", webhook("slow.kairos.test", hooks.url + "/slow", timeoutSeconds=1))
    )
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 500
    assert "context deadline exceeded" in body["message"]

    await http.call(
        "PATCH",
        f"{MUTATING}/slow",
        {
            "webhooks": [
                webhook("slow.kairos.test", hooks.url + "/slow", timeoutSeconds=1, failurePolicy="Ignore")
            ]
        },
        MERGE_PATCH,
    )
    status, body = await http.call("POST", PODS, pod("q"))
    assert status == 201, body
    # Ignored: created as sent, without the gate the late answer would have added.
    assert "schedulingGates" not in body["spec"]
    hooks.release.set()
    async with asyncio.timeout(30):
        await hooks.idle.wait()


# --- clientConfig.service: through the Service's endpoints -------------------------------------------------
SERVICES = "/api/v1/namespaces/default/services"
SLICES = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"


def service_hook(name: str, **extra: Any) -> Obj:
    hook = webhook(name, "", **extra)
    hook["clientConfig"] = {
        "service": {"namespace": "default", "name": "hooks", "port": 443, "path": "/mutate-pods"}
    }
    return hook


async def expose(http: Api, ports: list[int], *, ready: bool = True, service: bool = True) -> None:
    """The Service `default/hooks` (port 443, named https) and one EndpointSlice listing `ports` on
    loopback, each its own endpoint (one port per slice, so a slice per endpoint)."""
    if service:
        status, body = await http.call(
            "POST",
            SERVICES,
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": "hooks"},
                "spec": {"ports": [{"name": "https", "port": 443, "targetPort": 9443}]},
            },
        )
        assert status == 201, body
    for index, port in enumerate(ports):
        status, body = await http.call(
            "POST",
            SLICES,
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {"name": f"hooks-{index}", "labels": {"kubernetes.io/service-name": "hooks"}},
                "addressType": "IPv4",
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
            },
        )
        assert status == 201, body


def port_of(hooks: Hooks) -> int:
    return int(hooks.url.rsplit(":", 1)[1])


async def closed_port() -> int:
    """A port nobody listens on: bound, then closed."""
    runner = await serve(Hooks())
    port = int(runner.addresses[0][1])
    await runner.cleanup()
    return port


@pytest.fixture
async def second() -> AsyncIterator[Hooks]:
    out = Hooks()
    runner = await serve(out)
    try:
        yield out
    finally:
        await runner.cleanup()


async def test_a_service_s_endpoints_take_the_reviews_in_turn_one_endpoint_per_request(
    hooks: Hooks, second: Hooks, http: Api
) -> None:
    for server in (hooks, second):
        server.answers["/mutate-pods"] = add_gate
    await expose(http, [port_of(hooks), port_of(second)])
    await register(http, configuration("svc", service_hook("svc.kairos.test", timeoutSeconds=5)))

    for index in range(6):
        status, body = await http.call("POST", PODS, pod(f"p{index}"))
        assert status == 201, body
        assert body["spec"]["schedulingGates"] == [{"name": GATE}]

    # Each pod's review went to one endpoint, and the endpoints took turns.
    assert [r["name"] for r in hooks.requests("/mutate-pods")] == ["p0", "p2", "p4"]
    assert [r["name"] for r in second.requests("/mutate-pods")] == ["p1", "p3", "p5"]


async def test_an_endpoint_that_refuses_the_connection_passes_the_review_to_the_next(
    hooks: Hooks, http: Api
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    await expose(http, [await closed_port(), port_of(hooks)])
    await register(http, configuration("svc", service_hook("svc.kairos.test", failurePolicy="Fail")))

    for index in range(4):
        status, body = await http.call("POST", PODS, pod(f"p{index}"))
        assert status == 201, body
        assert body["spec"]["schedulingGates"] == [{"name": GATE}]
    assert len(hooks.requests("/mutate-pods")) == 4


async def test_a_service_whose_endpoints_all_refuse_fails_the_call_under_the_failure_policy(
    http: Api,
) -> None:
    await expose(http, [await closed_port(), await closed_port()])
    await register(http, configuration("svc", service_hook("svc.kairos.test", failurePolicy="Fail")))
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 500
    assert 'failed calling webhook "svc.kairos.test"' in body["message"]


@pytest.mark.parametrize(
    ("service", "endpoints", "ready", "why"),
    [
        pytest.param(False, False, True, 'service "default/hooks" not found', id="no Service"),
        pytest.param(
            True, False, True, 'no endpoints available for service "default/hooks"', id="no endpoints"
        ),
        pytest.param(
            True, True, False, 'no endpoints available for service "default/hooks"', id="none ready"
        ),
    ],
)
async def test_a_service_with_no_ready_endpoint_fails_the_call_under_the_failure_policy(
    hooks: Hooks, http: Api, service: bool, endpoints: bool, ready: bool, why: str
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    await expose(http, [port_of(hooks)] if endpoints else [], ready=ready, service=service)
    await register(http, configuration("svc", service_hook("svc.kairos.test", failurePolicy="Fail")))
    status, body = await http.call("POST", PODS, pod("p"))
    assert status == 500
    assert body["message"] == f'Internal error occurred: failed calling webhook "svc.kairos.test": {why}'

    # failurePolicy Ignore: the pod is created as sent, and no review reached the endpoint.
    await http.call(
        "PATCH",
        f"{MUTATING}/svc",
        {"webhooks": [service_hook("svc.kairos.test", failurePolicy="Ignore")]},
        MERGE_PATCH,
    )
    status, body = await http.call("POST", PODS, pod("q"))
    assert status == 201, body
    assert "schedulingGates" not in body["spec"]
    assert hooks.requests("/mutate-pods") == []


# --- matching -------------------------------------------------------------------------------------------------
async def test_namespace_and_object_selectors_choose_the_requests_sent(
    sim: KubeSim, hooks: Hooks, http: Api
) -> None:
    for ns, labels in (("teams", {"kairos.io/gated": "yes"}), ("kube-other", {})):
        status, body = await http.call(
            "POST", "/api/v1/namespaces", {"metadata": {"name": ns, "labels": labels}}
        )
        assert status == 201, body
    await register(
        http,
        configuration(
            "sel",
            webhook(
                "sel.kairos.test",
                hooks.url + "/sel",
                namespaceSelector={
                    "matchExpressions": [{"key": "kairos.io/gated", "operator": "In", "values": ["yes"]}]
                },
                objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            ),
        ),
    )
    for ns, name, labels in (
        ("teams", "sent", None),
        ("teams", "skipped", {"skip": "1"}),
        ("kube-other", "other-namespace", None),
        ("default", "default-namespace", None),
    ):
        status, body = await http.call("POST", f"/api/v1/namespaces/{ns}/pods", pod(name, labels=labels))
        assert status == 201, body
    assert [(r["namespace"], r["object"]["metadata"]["name"]) for r in hooks.requests("/sel")] == [
        ("teams", "sent")
    ]


async def test_rules_match_operations_resources_and_subresources(hooks: Hooks, http: Api) -> None:
    rule = {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"]}
    await register(
        http,
        configuration(
            "rules",
            webhook("pods.kairos.test", hooks.url + "/pods", rules=[{**rule, "resources": ["pods"]}]),
            webhook(
                "status.kairos.test", hooks.url + "/status", rules=[{**rule, "resources": ["pods/status"]}]
            ),
            webhook(
                "all.kairos.test",
                hooks.url + "/all",
                rules=[{**rule, "operations": ["*"], "resources": ["*/*"]}],
            ),
        ),
        validating=True,
    )
    assert (await http.call("POST", PODS, pod("p")))[0] == 201
    assert (await http.call("POST", "/api/v1/namespaces/default/configmaps", {"metadata": {"name": "c"}}))[
        0
    ] == 201
    assert hooks.requests("/pods") == []
    assert hooks.requests("/status") == []
    assert [r["resource"]["resource"] for r in hooks.requests("/all")] == ["pods", "configmaps"]

    status, _ = await http.call("PATCH", f"{PODS}/p/status", {"status": {"message": "x"}}, MERGE_PATCH)
    assert status == 200
    [update] = hooks.requests("/status")
    assert update["subResource"] == "status"
    assert update["oldObject"]["metadata"]["name"] == "p"
    assert hooks.requests("/pods") == []

    status, _ = await http.call("PATCH", f"{PODS}/p", {"metadata": {"labels": {"a": "b"}}}, MERGE_PATCH)
    assert status == 200
    [update] = hooks.requests("/pods")
    assert update["operation"] == "UPDATE"
    assert update["object"]["metadata"]["labels"] == {"a": "b"}
    assert "labels" not in update["oldObject"]["metadata"]

    status, _ = await http.call("DELETE", f"{PODS}/p")
    assert status == 200
    assert hooks.requests("/all")[-1]["operation"] == "DELETE"
    assert hooks.requests("/all")[-1]["object"] is None


async def test_a_configuration_written_or_deleted_decides_the_very_next_request(
    hooks: Hooks, http: Api
) -> None:
    # kubesim remembers which requests no webhook has a rule for (most writes skip admission); every
    # write of a configuration must be seen by the next request.
    only_configmaps = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"]}
    config = configuration(
        "moving",
        webhook("m.kairos.test", hooks.url + "/m", rules=[{**only_configmaps, "resources": ["configmaps"]}]),
    )
    stored = await register(http, config)
    assert (await http.call("POST", PODS, pod("a")))[0] == 201
    assert hooks.requests("/m") == []

    changed = {
        **stored,
        "webhooks": [{**stored["webhooks"][0], "rules": [{**only_configmaps, "resources": ["pods"]}]}],
    }
    status, body = await http.call("PUT", f"{MUTATING}/moving", changed)
    assert status == 200, body
    assert (await http.call("POST", PODS, pod("b")))[0] == 201
    assert [r["name"] for r in hooks.requests("/m")] == ["b"]

    assert (await http.call("DELETE", f"{MUTATING}/moving"))[0] == 200
    assert (await http.call("POST", PODS, pod("c")))[0] == 201
    assert [r["name"] for r in hooks.requests("/m")] == ["b"]


async def test_configurations_are_defaulted_and_checked(http: Api) -> None:
    stored = await register(http, configuration("d", webhook("d.kairos.test", "http://127.0.0.1:1/x")))
    [hook] = stored["webhooks"]
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["timeoutSeconds"] == 10
    assert hook["reinvocationPolicy"] == "Never"
    assert hook["rules"][0]["scope"] == "*"
    for bad, field_path in (
        (webhook("two.segments", "http://127.0.0.1:1/x"), "webhooks[0].name"),
        (webhook("t.kairos.test", "http://127.0.0.1:1/x", timeoutSeconds=31), "webhooks[0].timeoutSeconds"),
        (webhook("s.kairos.test", "http://127.0.0.1:1/x", sideEffects="Some"), "webhooks[0].sideEffects"),
        (webhook("u.kairos.test", "ftp://127.0.0.1:1/x"), "webhooks[0].clientConfig.url"),
    ):
        status, body = await http.call("POST", MUTATING, configuration("bad", bad))
        assert status == 422, body
        assert field_path in body["message"]


# --- https --------------------------------------------------------------------------------------------------
async def test_https_webhooks_are_verified_against_the_ca_bundle(tmp_path: Path, http: Api) -> None:
    pki = throwaway_pki(tmp_path / "pki")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki.cert, pki.key)
    secure = Hooks(answers={"/mutate-pods": add_gate})
    runner = await serve(secure, context)
    try:
        bundle = base64.b64encode(await asyncio.to_thread(Path(pki.ca).read_bytes)).decode()
        hook = webhook("tls.kairos.test", secure.url + "/mutate-pods")
        hook["clientConfig"]["caBundle"] = bundle
        await register(http, configuration("tls", hook))
        status, body = await http.call("POST", PODS, pod("p"))
        assert status == 201, body
        assert body["spec"]["schedulingGates"] == [{"name": GATE}]

        # Without the bundle the throwaway CA is not trusted: the call fails (failurePolicy Fail).
        del hook["clientConfig"]["caBundle"]
        status, body = await http.call("PUT", f"{MUTATING}/tls", configuration("tls", hook))
        assert status == 200, body
        status, body = await http.call("POST", PODS, pod("q"))
        assert status == 500
        assert "certificate" in body["message"].lower()
    finally:
        await runner.cleanup()


# --- kubectl ------------------------------------------------------------------------------------------------
async def test_kubectl_applies_lists_and_deletes_webhook_configurations(
    sim: KubeSim, hooks: Hooks, http: Api, tmp_path: Path
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    manifest = f"""
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: kairos-after-gate
webhooks:
  - name: after.kairos.io
    clientConfig:
      url: {hooks.url}/mutate-pods
    rules:
      - operations: ["CREATE"]
        apiGroups: [""]
        apiVersions: ["v1"]
        resources: ["pods"]
    failurePolicy: Ignore
    sideEffects: None
    admissionReviewVersions: ["v1"]
"""
    kubeconfig = tmp_path / "kubeconfig"
    rc, out, err = await kubectl(kubeconfig, "apply", "-f", "-", stdin=manifest)
    assert rc == 0, err
    assert "created" in out
    rc, out, err = await kubectl(kubeconfig, "get", "mutatingwebhookconfigurations")
    assert rc == 0, err
    header, row = out.splitlines()[:2]
    assert header.split()[:2] == ["NAME", "WEBHOOKS"]
    assert row.split()[:2] == ["kairos-after-gate", "1"]

    rc, out, err = await kubectl(kubeconfig, "run", "gated", "--image=busybox", "--restart=Never")
    assert rc == 0, err
    rc, out, err = await kubectl(kubeconfig, "get", "pods", "gated")
    assert rc == 0, err
    assert "SchedulingGated" in out

    rc, out, err = await kubectl(kubeconfig, "delete", "mutatingwebhookconfiguration", "kairos-after-gate")
    assert rc == 0, err
    assert sim.cluster.objects("admissionregistration.k8s.io/mutatingwebhookconfigurations") == []


# --- pods the controllers create ----------------------------------------------------------------------------
async def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    assert condition(), what


def job(name: str, parallelism: int) -> Obj:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "template": {
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "restartPolicy": "Never",
                    "containers": [{"name": "main", "image": "busybox"}],
                }
            },
        },
    }


async def test_pods_created_by_controllers_pass_through_the_webhooks_once_each(
    sim: KubeSim, hooks: Hooks, http: Api
) -> None:
    hooks.answers["/mutate-pods"] = add_gate
    await register(http, configuration("kairos", webhook("after.kairos.test", hooks.url + "/mutate-pods")))
    status, body = await http.call("POST", "/apis/batch/v1/namespaces/default/jobs", job("stage", 3))
    assert status == 201, body
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "schedulerName": "kai-scheduler",
                    "containers": [{"name": "main", "image": "busybox"}],
                },
            },
        },
    }
    status, body = await http.call("POST", "/apis/apps/v1/namespaces/default/deployments", deployment)
    assert status == 201, body

    def pods() -> list[Obj]:
        return sim.cluster.objects("pods", "default")

    await wait_for(lambda: len(pods()) == 5, "the Job's 3 pods and the Deployment's 2")
    assert all(p["spec"]["schedulingGates"] == [{"name": GATE}] for p in pods())
    # The webhook saw each pod once, with its owner, before it was stored (no uid yet).
    requests = hooks.requests("/mutate-pods")
    assert len(requests) == 5
    assert {r["object"]["metadata"]["ownerReferences"][0]["kind"] for r in requests} == {"Job", "ReplicaSet"}
    assert all("uid" not in r["object"]["metadata"] for r in requests)
    # Reconciling again creates nothing more.
    status, _ = await http.call(
        "PATCH",
        "/apis/batch/v1/namespaces/default/jobs/stage",
        {"metadata": {"labels": {"x": "y"}}},
        MERGE_PATCH,
    )
    assert status == 200
    await asyncio.sleep(0.3)
    assert len(pods()) == 5
    assert len(hooks.requests("/mutate-pods")) == 5


async def test_a_controller_whose_pod_is_refused_reports_it_and_tries_again_later(
    sim: KubeSim, hooks: Hooks, http: Api
) -> None:
    refusals = 0

    def refuse_twice(request: Obj) -> Obj:
        nonlocal refusals
        if refusals < 2:
            refusals += 1
            return {"allowed": False, "status": {"code": 403, "message": "not yet"}}
        return {"allowed": True}

    hooks.answers["/deny"] = refuse_twice
    await register(
        http, configuration("v", webhook("deny.kairos.test", hooks.url + "/deny")), validating=True
    )
    status, body = await http.call("POST", "/apis/batch/v1/namespaces/default/jobs", job("late", 1))
    assert status == 201, body

    def events() -> list[Obj]:
        return [e for e in sim.cluster.objects("events", "default") if e["reason"] == "FailedCreate"]

    await wait_for(lambda: bool(events()), "a FailedCreate event on the Job")
    assert 'admission webhook "deny.kairos.test" denied the request: not yet' in events()[0]["message"]
    assert events()[0]["involvedObject"]["name"] == "late"
    # Tried again after a pause (not in a loop), then created.
    await wait_for(lambda: len(sim.cluster.objects("pods", "default")) == 1, "the Job's pod")
    assert len(hooks.requests("/deny")) == 3
