"""The HTTP shell of the simulated API server (aiohttp): routes requests to the pure `Cluster`.

`KubeSim` is what tests and `python -m tools.kubesim` run::

    sim = KubeSim(SimOptions(run_delay=0))
    sim.add_nodes(generated_nodes(4, 8))
    sim.load_manifests("deploy/crds")
    url = await sim.start()  # http://127.0.0.1:<port>
    sim.write_kubeconfig(tmp_path / "kubeconfig")
    ...
    sim.cluster.get(sim.cluster.type_of("pods"), "default", "p")  # assertions on the store
    await sim.stop()

The shell parses a request (path, query, Accept, body), calls one `Cluster` method, encodes the answer with
msgspec (a Table when kubectl asks for `as=Table`, aggregated discovery when asked for it), turns an
`ApiError` into its Status, then lets the cluster settle and schedules the next timer (a bound pod
starting, a pod finishing) on the event loop. Watches stream newline-delimited events until the client
goes, `timeoutSeconds` passes or the server stops, with BOOKMARK events every `bookmark_seconds` when the
client allows them. Requests are not authenticated (kubectl sends no credentials over plain HTTP).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
import yaml
from aiohttp import web

from shared.errors import ConfigError
from shared.model import Node
from tools.kubesim import discovery, protobuf
from tools.kubesim.admission import Attributes
from tools.kubesim.assembly import controllers_of
from tools.kubesim.cluster import BOOKMARK, Cluster, SimOptions, WatchStream, Write
from tools.kubesim.config import read_manifests
from tools.kubesim.errors import ApiError, bad_request, not_found
from tools.kubesim.faults import Fault, FaultPlan, Faults, read_plan, verb_of
from tools.kubesim.nodes import node_object
from tools.kubesim.resources import ResourceType
from tools.kubesim.tables import table
from tools.kubesim.webhooks import Webhooks

__all__ = ["KubeSim", "kubeconfig_text"]

Obj = dict[str, Any]
log = logging.getLogger("kubesim")

_JSON = "application/json"
_encoder = msgspec.json.Encoder()
_MAX_BODY = 64 * 2**20
"""Large enough for any CRD (the biggest upstream ones are a few megabytes)."""
_CHUNK = 1000
"""Objects per write of a long list or of a watch's backlog (bounds the memory of one response)."""
_WATCH_BATCH_S = 0.005
"""A watch writes at most once per this many seconds: the events of a busy moment go out together (one
write and one wake-up of the watch per batch, not per event); an event after a quiet spell goes at once."""
_ENCODED_KEPT = 4096
"""Watch events remembered encoded, so that the watchers sent the same object share one encoding."""
_RETRY_S = 1.0
"""How long a controller waits before creating a pod again after admission refused one (the real ones back
off from 5 ms up to minutes; one pause keeps a webhook that always fails from being called in a loop)."""
_ADMISSION_ATTEMPTS = 5
"""How often an update is begun again when its object changed while its webhooks ran (then 409)."""
# A timer fires a hair after its deadline, so the cluster's clock has surely reached it.
_TIMER_SLACK = 1e-3


def kubeconfig_text(server: str) -> str:
    """A kubeconfig for `server` (a dummy token: the simulated server accepts any request)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "kubesim", "cluster": {"server": server}}],
        "users": [{"name": "kubesim", "user": {"token": "kubesim-dummy-token"}}],
        "contexts": [
            {"name": "kubesim", "context": {"cluster": "kubesim", "user": "kubesim", "namespace": "default"}}
        ],
        "current-context": "kubesim",
        "preferences": {},
    }
    dumped: str = yaml.safe_dump(config, sort_keys=False)
    return dumped


def _truthy(value: str | None) -> bool:
    return value is not None and value.lower() in ("true", "1", "yes")


def _wants_table(accept: str) -> bool:
    return any("as=Table" in part and "g=meta.k8s.io" in part for part in accept.split(","))


def _wants_aggregated(accept: str) -> bool:
    return any(
        "as=APIGroupDiscoveryList" in part and "v=v2" in part and "v=v2beta1" not in part
        for part in accept.split(",")
    )


def _respond(obj: Any, status: int = 200, content_type: str = _JSON) -> web.Response:
    return web.Response(body=_encoder.encode(obj), status=status, headers={"Content-Type": content_type})


async def _respond_list(request: web.BaseRequest, head: Obj, items: list[Obj]) -> web.StreamResponse:
    """A list object; a long one is streamed in chunks, so the whole encoding never sits in memory."""
    if len(items) <= _CHUNK:
        return _respond({**head, "items": items})
    response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
    response.enable_chunked_encoding()
    await response.prepare(request)
    # '{...head...,"items":[' then the items, comma-separated, then ']}'.
    await response.write(_encoder.encode(head)[:-1] + b',"items":[')
    for start in range(0, len(items), _CHUNK):
        part = _encoder.encode(items[start : start + _CHUNK])[1:-1]
        await response.write(part + (b"," if start + _CHUNK < len(items) else b""))
    await response.write(b"]}")
    await response.write_eof()
    return response


def _options(kind: str, dry_run: bool) -> Obj:
    """The CreateOptions/UpdateOptions/DeleteOptions an AdmissionReview carries."""
    out: Obj = {"kind": kind, "apiVersion": "meta.k8s.io/v1"}
    if dry_run:
        out["dryRun"] = ["All"]
    return out


def _warned(response: web.Response, warnings: list[str]) -> web.Response:
    """`response` with the admission webhooks' warnings as Warning headers (kubectl prints them)."""
    for text in warnings:
        response.headers.add("Warning", '299 - "' + text.replace('"', "'") + '"')
    return response


def _error(exc: ApiError) -> web.Response:
    response = _respond(exc.status(), exc.code)
    if exc.retry_after:
        response.headers["Retry-After"] = str(exc.retry_after)
    return response


class _Request:
    """One resource request, parsed from its path."""

    def __init__(self, rt: ResourceType, namespace: str | None, name: str | None, subresource: str) -> None:
        self.rt = rt
        self.namespace = namespace
        self.name = name
        self.subresource = subresource


class KubeSim:
    """The simulated API server: a `Cluster` served over HTTP on loopback."""

    def __init__(
        self,
        options: SimOptions | None = None,
        *,
        bookmark_seconds: float = 10.0,
        faults: FaultPlan | None = None,
    ) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._offset = 0.0
        self.cluster = Cluster(options, clock=self._now)
        self.controllers = controllers_of(self.cluster)
        """The cluster's workload controllers (`tools.kubesim.assembly`), which the admission of deferred pods
        reports to."""
        self.cluster.start(self.controllers)
        self.bookmark_seconds = bookmark_seconds
        self.liveness_seconds = 5.0
        """How long an idle watch waits before checking that its client is still connected."""
        self.watch_ended = asyncio.Event()
        """Set whenever a watch stream ends (for tests to await)."""
        self._runner: web.ServerRunner | None = None
        self._url = ""
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._watches: set[WatchStream] = set()
        self._encoded: dict[tuple[str, int], tuple[Obj, bytes]] = {}
        """(event type, id of the object) -> (the object, its event encoded): the recent watch events."""
        self._stopping = False
        self.faults = Faults(faults)
        """The fault plan in force (`tools.kubesim.faults`), changed through `POST /kubesim/faults`."""
        self.bindings: dict[str, list[str]] = {}
        """Every accepted pods/binding call, per pod (`namespace/name`): the nodes, in order. A pod bound
        twice would show two; the chaos checker reads it through `GET /kubesim/bindings`."""
        self.binding_refusals: dict[str, int] = {}
        """pods/binding calls refused (409: the pod already had a node), per pod."""
        self.requests: Counter[tuple[str, str, str, str]] = Counter()
        """Every resource request served, by (client, verb, resource, status): the client is the first word
        of its User-Agent, the resource a plural or `plural/subresource`, the status its class (`2xx` for
        201), `2xx unchanged` for a patch or update that left the object as it was (its resourceVersion
        did not move: a write that need not have been sent). Read through `GET /kubesim/requests` (the
        bench's calls per pod)."""
        self.webhooks = Webhooks(self.cluster.store)
        """The admission chain: the webhook configurations stored in the cluster, called per write."""
        self.cluster.defer_creates = self.webhooks.configured
        self._admitting: asyncio.Task[None] | None = None
        self._retries: dict[tuple[str, str, str], asyncio.TimerHandle] = {}
        """Owners whose controller creates a pod again after a pause (admission refused one), by key."""

    # --- lifecycle ------------------------------------------------------------------------------------------
    def _now(self) -> float:
        if self._loop is None:
            return time.time()
        return self._loop.time() + self._offset

    @property
    def url(self) -> str:
        if not self._url:
            raise RuntimeError("the simulated API server is not started")
        return self._url

    @property
    def store(self) -> Any:
        """The object store (`tools.kubesim.store.Store`), for assertions."""
        return self.cluster.store

    def add_nodes(self, nodes: Iterable[Node]) -> None:
        """Create simulated nodes for model nodes (before or after `start`)."""
        for node in nodes:
            self.cluster.add_node(node_object(node))
        self._after_write()

    def load_manifests(self, path: str | Path) -> int:
        """Create (or replace) the manifests of a file or directory (CRDs first); returns how many.

        Raises `InvalidObject` for an unreadable file and `ConfigError` for a manifest the server refuses.
        """
        docs = read_manifests(path)
        docs.sort(key=lambda d: d.get("kind") != "CustomResourceDefinition")
        for doc in docs:
            try:
                self.cluster.apply_manifest(doc)
            except ApiError as exc:
                name = (doc.get("metadata") or {}).get("name", "?")
                raise ConfigError(f"{path}: {doc.get('kind', '?')} {name!r}: {exc.message}") from exc
        self._after_write()
        return len(docs)

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Serve on `host`:`port` (0: a free port); returns the base URL (with the machine's host name when
        `host` is a wildcard address)."""
        loop = asyncio.get_running_loop()
        # Timestamps must read as wall time while timers follow the loop's clock (which tests may fake).
        wall = self._now()
        self._loop = loop
        self._offset = wall - loop.time()
        # A bare server with one handler: the request path is routed here, so aiohttp's router and
        # application machinery would only cost time on every request.
        server = web.Server(self._handle, request_factory=self._request, access_log=None)
        self._runner = web.ServerRunner(server, shutdown_timeout=1.0, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        sockets = self._runner.addresses
        bound_port = sockets[0][1] if sockets else port
        # Listening on every interface (a container): others reach the server by the machine's name.
        shown = socket.gethostname() if host in ("0.0.0.0", "", "::") else host
        if ":" in shown:
            shown = f"[{shown}]"
        self._url = f"http://{shown}:{bound_port}"
        self._stopping = False
        self._after_write()
        return self._url

    async def stop(self) -> None:
        """End every watch, stop serving and cancel the timer."""
        self._stopping = True
        for stream in list(self._watches):
            stream.on_close()
        for handle in self._retries.values():
            handle.cancel()
        self._retries.clear()
        if self._admitting is not None:
            self._admitting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._admitting
            self._admitting = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.webhooks.close()

    def write_kubeconfig(self, path: str | Path, *, server: str | None = None) -> Path:
        """Write a kubeconfig for this server (or for `server`, the URL clients should use)."""
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        # Written whole or not at all: starters poll for the file and read it as soon as it exists.
        partial = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        partial.write_text(kubeconfig_text(server or self.url), encoding="utf-8")
        partial.replace(out)
        return out

    def _request(self, message: Any, payload: Any, protocol: Any, writer: Any, task: Any) -> web.BaseRequest:
        assert self._loop is not None
        return web.BaseRequest(
            message, payload, protocol, writer, task, self._loop, client_max_size=_MAX_BODY
        )

    # --- timers ---------------------------------------------------------------------------------------------
    def _after_write(self) -> None:
        self.cluster.settle()
        self._schedule()

    def _schedule(self) -> None:
        if self._loop is None or self._stopping:
            return
        if self.cluster.deferred and (self._admitting is None or self._admitting.done()):
            self._admitting = self._loop.create_task(self._admit_deferred())
        deadline = self.cluster.next_deadline()
        if deadline is None:
            return
        at = deadline - self._offset + _TIMER_SLACK
        if self._timer is not None:
            if self._timer_at <= at:
                return
            self._timer.cancel()
        self._timer_at = at
        self._timer = self._loop.call_at(at, self._fire)

    def _fire(self) -> None:
        self._timer = None
        try:
            self.cluster.settle()
        except Exception:  # a bug in a controller must not stop the timers of the whole cluster
            log.exception("kubesim: settling the cluster failed")
        self._schedule()

    # --- routing --------------------------------------------------------------------------------------------
    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            response = await self._route(request)
        except ApiError as exc:
            return _error(exc)
        except Exception as exc:  # every request gets an answer; the server stays up
            log.exception("kubesim: %s %s failed", request.method, request.path)
            return _error(
                ApiError(500, "InternalError", f"an error on the server ({type(exc).__name__}: {exc})")
            )
        if request.method not in ("GET", "HEAD"):
            try:
                self._after_write()
            except Exception:
                log.exception("kubesim: settling the cluster failed")
        return response

    async def _route(self, request: web.BaseRequest) -> web.StreamResponse:
        parts = [p for p in request.path.split("/") if p]
        accept = request.headers.get("Accept", "")
        registry = self.cluster.registry
        if not parts:
            return _respond({"paths": ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]})
        head = parts[0]
        if head in ("healthz", "readyz", "livez") and len(parts) == 1:
            return web.Response(text="ok", content_type="text/plain")
        if head == "version" and len(parts) == 1:
            return _respond(discovery.version_info())
        if head == "openapi":
            return self._openapi(parts)
        if head == "kubesim":
            return await self._admin(request, parts[1:])
        if head == "api":
            if len(parts) == 1:
                if _wants_aggregated(accept):
                    return _respond(
                        discovery.aggregated(registry, legacy=True), content_type=discovery.AGGREGATED_V2
                    )
                return _respond(discovery.api_versions(request.host))
            if len(parts) == 2:
                doc = discovery.resource_list(registry, "", parts[1])
                if doc is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return _respond(doc)
            return await self._resource(request, "", parts[1], parts[2:])
        if head == "apis":
            if len(parts) == 1:
                if _wants_aggregated(accept):
                    return _respond(
                        discovery.aggregated(registry, legacy=False), content_type=discovery.AGGREGATED_V2
                    )
                return _respond(discovery.group_list(registry))
            if len(parts) == 2:
                group = discovery.api_group(registry, parts[1])
                if group is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return _respond(group)
            if len(parts) == 3:
                doc = discovery.resource_list(registry, parts[1], parts[2])
                if doc is None:
                    raise ApiError(404, "NotFound", "the server could not find the requested resource")
                return _respond(doc)
            return await self._resource(request, parts[1], parts[2], parts[3:])
        raise ApiError(404, "NotFound", "the server could not find the requested resource")

    def _openapi(self, parts: list[str]) -> web.Response:
        registry = self.cluster.registry
        if parts[1:] == ["v3"]:
            return _respond(discovery.openapi_v3_root(registry))
        doc = None
        if len(parts) == 4 and parts[1:3] == ["v3", "api"]:
            doc = discovery.openapi_v3_document(registry, "", parts[3])
        elif len(parts) == 5 and parts[1:3] == ["v3", "apis"]:
            doc = discovery.openapi_v3_document(registry, parts[3], parts[4])
        if doc is None:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _respond(doc)

    def _parse(self, group: str, version: str, rest: list[str]) -> _Request:
        lookup = self.cluster.lookup
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace = rest[1]
            rt = lookup(group, version, rest[2])
            if not rt.namespaced:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            name = rest[3] if len(rest) > 3 else None
            sub = rest[4] if len(rest) > 4 else ""
            if len(rest) > 5:
                raise ApiError(404, "NotFound", "the server could not find the requested resource")
            return _Request(rt, namespace, name, sub)
        rt = lookup(group, version, rest[0])
        name = rest[1] if len(rest) > 1 else None
        sub = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3 or (rt.namespaced and name is not None):
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        if sub and sub not in rt.subresources:
            raise ApiError(404, "NotFound", "the server could not find the requested resource")
        return _Request(rt, None, name, sub)

    async def _body(self, request: web.BaseRequest) -> Any:
        raw = await request.read()
        if not raw:
            return None
        content_type = request.headers.get("Content-Type", _JSON).split(";")[0].strip()
        if content_type == "application/vnd.kubernetes.protobuf":
            return protobuf.decode_object(raw)
        try:
            if content_type in ("application/yaml", "application/x-yaml", "text/yaml"):
                return yaml.safe_load(raw)
            return msgspec.json.decode(raw)
        except (msgspec.DecodeError, yaml.YAMLError) as exc:
            raise bad_request(f"the request body is not valid JSON: {exc}") from exc

    async def _resource(
        self, request: web.BaseRequest, group: str, version: str, rest: list[str]
    ) -> web.StreamResponse:
        req = self._parse(group, version, rest)
        rt, name, sub = req.rt, req.name, req.subresource
        watching = name is None and _truthy(request.query.get("watch"))
        verb = verb_of(request.method, name, watching)
        resource = f"{rt.plural}/{sub}" if sub else rt.plural
        status = "5xx"
        before = self._version_of(req) if verb in ("patch", "update") else None
        try:
            response = await self._serve(request, req, verb, resource, watching)
        except ApiError as exc:
            status = f"{exc.code // 100}xx"
            raise
        else:
            status = f"{response.status // 100}xx"
            if before is not None and response.status < 300 and before == self._version_of(req):
                status += " unchanged"
            return response
        finally:
            client = request.headers.get("User-Agent", "").partition("/")[0] or "unknown"
            self.requests[(client, verb, resource, status)] += 1

    def _version_of(self, req: _Request) -> str | None:
        """The stored resourceVersion of the object a request names (None: none stored)."""
        if req.name is None:
            return None
        try:
            stored = self.cluster.get_stored(req.rt, req.namespace, req.name)
        except ApiError:
            return None
        version: str | None = stored["metadata"].get("resourceVersion")
        return version

    async def _serve(
        self, request: web.BaseRequest, req: _Request, verb: str, resource: str, watching: bool
    ) -> web.StreamResponse:
        rt, ns, name, sub = req.rt, req.namespace, req.name, req.subresource
        cluster = self.cluster
        query = request.query
        method = request.method
        fault = self.faults.pick(
            verb,
            resource,
            resume=watching and query.get("resourceVersion") not in (None, "", "0"),
        )
        if fault is not None:
            answer = await self._inject(request, fault)
            if answer is not None:
                return answer
        dry_run = "All" in query.getall("dryRun", [])
        accept = request.headers.get("Accept", "")
        if rt.review and (method != "POST" or name is not None):
            raise ApiError(405, "MethodNotAllowed", f"{rt.plural} can only be created")
        if method in ("GET", "HEAD"):
            if name is None:
                if _truthy(query.get("watch")):
                    return await self._watch(request, rt, ns)
                labels, fields = cluster.selectors(rt, query.get("labelSelector"), query.get("fieldSelector"))
                limit = self._int(query.get("limit"), "limit")
                result = cluster.list_objects(
                    rt,
                    ns,
                    labels=labels,
                    fields=fields,
                    limit=limit,
                    continue_token=query.get("continue", ""),
                )
                if _wants_table(accept):
                    return _respond(
                        table(
                            rt,
                            result.items,
                            now=cluster.now(),
                            include=query.get("includeObject", "Metadata"),
                            resource_version=result.resource_version,
                            continue_token=result.continue_token,
                        )
                    )
                md: Obj = {"resourceVersion": result.resource_version}
                if result.continue_token:
                    md["continue"] = result.continue_token
                head = {"kind": rt.list_kind, "apiVersion": rt.api_version, "metadata": md}
                return await _respond_list(request, head, result.items)
            if sub == "log":
                raise bad_request(
                    f'logs are not supported by the simulated cluster (kubesim): pod "{name}" runs no containers'
                )
            if sub == "scale":
                return _respond(cluster.get_scale(rt, ns, name))
            obj = cluster.get(rt, ns, name)
            if _wants_table(accept) and not sub:
                return _respond(
                    table(rt, [obj], now=cluster.now(), include=query.get("includeObject", "Metadata"))
                )
            return _respond(obj)
        if method == "POST":
            body = await self._body(request)
            if name is None and rt.review:
                return _respond(cluster.review(rt, ns, body), 201)
            if name is None:
                obj, _, warnings = await self._write(lambda: cluster.begin_create(rt, ns, body), dry_run)
                return _warned(_respond(obj, 200 if dry_run else 201), warnings)
            if (
                sub in ("binding", "eviction")
                and rt.storage == "pods"
                and self.webhooks.routed("CREATE", rt, sub, cluster.registry.equivalents(rt))
            ):
                kind = ("", "v1", "Binding") if sub == "binding" else ("policy", "v1", "Eviction")
                admitted = await self.webhooks.admit(
                    Attributes(
                        operation="CREATE",
                        rt=rt,
                        subresource=sub,
                        namespace=ns or "",
                        name=name,
                        obj=body if isinstance(body, dict) else None,
                        old=None,
                        dry_run=dry_run,
                        options=_options("CreateOptions", dry_run),
                        kind=kind,
                    )
                )
                body = admitted.obj if admitted.obj is not None else body
            if sub == "binding" and rt.storage == "pods":
                key = f"{ns}/{name}"
                try:
                    bound = cluster.bind(ns or "", name, body)
                except ApiError as exc:
                    if exc.code == 409:
                        self.binding_refusals[key] = self.binding_refusals.get(key, 0) + 1
                    raise
                node = cluster.get_stored(rt, ns, name)["spec"]["nodeName"]
                self.bindings.setdefault(key, []).append(node)
                return _respond(bound, 201)
            if sub == "eviction" and rt.storage == "pods":
                return _respond(cluster.evict(ns or "", name, body), 201)
            raise ApiError(405, "MethodNotAllowed", f"POST is not supported on {rt.plural}/{sub or name}")
        if method == "PUT":
            body = await self._body(request)
            if name is None:
                raise ApiError(405, "MethodNotAllowed", f"PUT is not supported on the {rt.plural} collection")
            if sub == "scale":
                spec = (body or {}).get("spec") or {}
                rv = ((body or {}).get("metadata") or {}).get("resourceVersion")
                return _respond(cluster.set_scale(rt, ns, name, spec.get("replicas"), rv))
            if sub == "finalize":
                return _respond(cluster.get(rt, ns, name))
            obj, created, warnings = await self._write(
                lambda: cluster.begin_replace(rt, ns, name, body, subresource=sub), dry_run
            )
            return _warned(_respond(obj, 201 if created else 200), warnings)
        if method == "PATCH":
            if name is None:
                raise ApiError(
                    405, "MethodNotAllowed", f"PATCH is not supported on the {rt.plural} collection"
                )
            data = await request.read()
            content_type = request.headers.get("Content-Type", "")
            if sub == "scale":
                return _respond(cluster.patch_scale(rt, ns, name, content_type, data))
            force = _truthy(query.get("force"))
            obj, created, warnings = await self._write(
                lambda: cluster.begin_patch(rt, ns, name, content_type, data, subresource=sub, force=force),
                dry_run,
            )
            return _warned(_respond(obj, 201 if created else 200), warnings)
        if method == "DELETE":
            body = await self._body(request)
            options: Obj = dict(body) if isinstance(body, dict) else {}
            if "propagationPolicy" in query:
                options["propagationPolicy"] = query["propagationPolicy"]
            grace = query.get("gracePeriodSeconds", "")
            if grace.isascii() and grace.lstrip("-").isdigit() and len(grace) < 19:
                options["gracePeriodSeconds"] = int(grace)
            if name is None:
                labels, fields = cluster.selectors(rt, query.get("labelSelector"), query.get("fieldSelector"))
                items = cluster.delete_collection(rt, ns, labels=labels, fields=fields, options=options)
                return _respond(
                    {
                        "kind": rt.list_kind,
                        "apiVersion": rt.api_version,
                        "metadata": {"resourceVersion": str(cluster.store.rv)},
                        "items": items,
                    }
                )
            warnings = await self._admit_delete(rt, ns, name, options, dry_run)
            return _warned(_respond(cluster.delete(rt, ns, name, options, dry_run=dry_run)), warnings)
        raise ApiError(405, "MethodNotAllowed", f"method {method} is not supported")

    # --- admission ----------------------------------------------------------------------------------------------
    async def _write(self, begin: Callable[[], Write], dry_run: bool) -> tuple[Obj, bool, list[str]]:
        """Begin a create or update, pass it through the admission webhooks, finish it: (object, created,
        warnings). An update whose object changed while the webhooks ran is begun again (its
        resourceVersion precondition, if the client gave one, then fails with 409 as it should)."""
        cluster = self.cluster
        for _ in range(_ADMISSION_ATTEMPTS):
            write = begin()
            rt = write.rt
            equivalents = cluster.registry.equivalents(rt)
            if not self.webhooks.routed(write.operation, rt, write.subresource, equivalents):
                return (*cluster.finish(write, dry_run=dry_run), [])
            md = write.obj.get("metadata") or {}
            shown = cluster.view(rt, write.obj)
            admitted = await self.webhooks.admit(
                Attributes(
                    operation=write.operation,
                    rt=rt,
                    subresource=write.subresource,
                    namespace=str(md.get("namespace") or ""),
                    name=str(md.get("name") or ""),
                    obj=shown,
                    old=cluster.view(rt, write.old) if write.old is not None else None,
                    dry_run=dry_run,
                    options=_options(
                        "CreateOptions" if write.operation == "CREATE" else "UpdateOptions", dry_run
                    ),
                    equivalents=equivalents,
                )
            )
            if admitted.obj is not shown and admitted.obj is not None:
                write.obj = cluster.stored_form(rt, admitted.obj)
                write.admitted = True
            if write.old is not None and not cluster.still_current(write):
                continue
            return (*cluster.finish(write, dry_run=dry_run), admitted.warnings)
        raise ApiError(
            409, "Conflict", "the object kept changing while admission webhooks were called; try again"
        )

    async def _admit_deferred(self) -> None:
        """Pass the pods controllers created (`Cluster.deferred`) through the admission webhooks, then store
        them; a refused one is reported on its owner (FailedCreate) and retried after `_RETRY_S`."""
        cluster = self.cluster
        controllers = self.controllers
        while cluster.deferred and not self._stopping:
            item = cluster.deferred.popleft()
            if not controllers.owner_alive(item):
                controllers.admitted(item, None, retry=False)
                continue
            write = item.write
            md = write.obj["metadata"]
            error: ApiError | None = None
            try:
                admitted = await self.webhooks.admit(
                    Attributes(
                        operation="CREATE",
                        rt=write.rt,
                        subresource="",
                        namespace=str(md.get("namespace") or ""),
                        name=str(md.get("name") or ""),
                        obj=write.obj,
                        old=None,
                        options=_options("CreateOptions", False),
                    )
                )
                if admitted.obj is not write.obj and admitted.obj is not None:
                    write.obj = admitted.obj
                    write.admitted = True
                if controllers.owner_alive(item):
                    cluster.finish(write)
            except ApiError as exc:
                error = exc
            controllers.admitted(item, error, retry=False)
            if error is not None and self._loop is not None:
                md = item.owner["metadata"]
                key = (item.storage, str(md.get("namespace", "")), str(md["name"]))
                if key not in self._retries:
                    self._retries[key] = self._loop.call_later(_RETRY_S, self._retry_owner, key)
            try:
                self._after_write()
            except Exception:
                log.exception("kubesim: settling the cluster failed")

    def _retry_owner(self, key: tuple[str, str, str]) -> None:
        self._retries.pop(key, None)
        if self._stopping:
            return
        self.controllers.dirty[key] = None
        try:
            self._after_write()
        except Exception:
            log.exception("kubesim: settling the cluster failed")

    async def _admit_delete(
        self, rt: ResourceType, ns: str | None, name: str, options: Obj, dry_run: bool
    ) -> list[str]:
        equivalents = self.cluster.registry.equivalents(rt)
        if not self.webhooks.routed("DELETE", rt, "", equivalents):
            return []
        existing = self.cluster.find(rt.storage, ns, name)
        if existing is None:
            return []  # the delete answers 404 itself
        admitted = await self.webhooks.admit(
            Attributes(
                operation="DELETE",
                rt=rt,
                subresource="",
                namespace=ns or "",
                name=name,
                obj=None,
                old=self.cluster.view(rt, existing),
                dry_run=dry_run,
                options={**_options("DeleteOptions", dry_run), **options},
            )
        )
        return admitted.warnings

    @staticmethod
    def _int(value: str | None, what: str) -> int:
        if value in (None, ""):
            return 0
        try:
            out = int(str(value))
        except ValueError as exc:
            raise bad_request(f"{what} must be an integer, got {value!r}") from exc
        if out < 0:
            raise bad_request(f"{what} must be >= 0")
        return out

    # --- faults and the admin endpoints -------------------------------------------------------------------------
    async def _inject(self, request: web.BaseRequest, fault: Fault) -> web.StreamResponse | None:
        """Apply `fault` to a request: wait, then an error answer (None: serve the request normally)."""
        if fault.delay > 0:
            await asyncio.sleep(fault.delay)
        if fault.status == 0:
            return None
        if fault.status == 410:
            gone = ApiError(410, "Expired", "too old resource version (fault injected by kubesim)")
            response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
            await response.prepare(request)
            await response.write(_encoder.encode({"type": "ERROR", "object": gone.status()}) + b"\n")
            await response.write_eof()
            return response
        if fault.status == 429:
            error = ApiError(429, "TooManyRequests", "too many requests (fault injected by kubesim)")
            answer = _error(error)
            answer.headers["Retry-After"] = str(fault.retry_after)
            return answer
        reason = "InternalError" if fault.status == 500 else "ServiceUnavailable"
        return _error(ApiError(fault.status, reason, f"fault injected by kubesim ({fault.status})"))

    def drop_watches(self, resource: str = "*") -> int:
        """Close every open watch (of one resource plural, or all): the stream ends as when a server or a
        proxy drops the connection; clients resume from their last resourceVersion. Returns how many."""
        dropped = 0
        for stream in list(self._watches):
            if resource in ("*", stream.rt.plural) and not stream.ended:
                # Events not yet written are lost with the connection, as on a real drop: the client must
                # resume from the last resourceVersion it saw.
                stream.pending.clear()
                stream.on_close()
                dropped += 1
        self.faults.count("dropped-watch", dropped)
        return dropped

    async def _admin(self, request: web.BaseRequest, parts: list[str]) -> web.StreamResponse:
        """`/kubesim/faults` (GET: plan and counts; POST: replace the plan), `/kubesim/faults/drop-watches`
        (POST, `?resource=pods`), `/kubesim/bindings` (GET: accepted and refused pods/binding calls),
        `/kubesim/requests` (GET: the resource requests served, by client, verb, resource and status),
        `/kubesim/v1/nodes/{node}/devices` (GET: the node's devices and what running containers see)."""
        method = request.method
        if len(parts) == 4 and parts[:2] == ["v1", "nodes"] and parts[3] == "devices" and method == "GET":
            devices = self.cluster.nodesim.kubelet.node_devices(parts[2])
            if devices is None:
                raise not_found("nodes", parts[2])
            return _respond(devices)
        if parts == ["faults"] and method == "GET":
            return _respond(self.faults.report())
        if parts == ["faults"] and method == "POST":
            try:
                plan = read_plan(await request.read(), "POST /kubesim/faults")
            except ConfigError as exc:
                raise bad_request(str(exc)) from exc
            self.faults.set_plan(plan)
            log.warning("kubesim: fault plan set: %d rules", len(plan.rules))
            return _respond(self.faults.report())
        if parts == ["faults", "drop-watches"] and method == "POST":
            dropped = self.drop_watches(request.query.get("resource", "*"))
            log.warning("kubesim: dropped %d watches", dropped)
            return _respond({"dropped": dropped})
        if parts == ["bindings"] and method == "GET":
            return _respond({"bindings": self.bindings, "refused": self.binding_refusals})
        if parts == ["requests"] and method == "GET":
            return _respond({"requests": self.request_counts()})
        raise ApiError(404, "NotFound", f"no admin endpoint {method} /kubesim/{'/'.join(parts)}")

    def request_counts(self) -> list[dict[str, Any]]:
        """The resource requests served so far (`requests`), one entry per (client, verb, resource,
        status class), most frequent first."""
        return [
            {"client": client, "verb": verb, "resource": resource, "status": status, "count": n}
            for (client, verb, resource, status), n in self.requests.most_common()
        ]

    # --- watch ------------------------------------------------------------------------------------------------
    def _event_bytes(self, kind: str, obj: Obj) -> bytes:
        """A watch event encoded, once for all the watchers sent this very object (stored objects are never
        mutated, so an object's encoding holds as long as the object is kept here)."""
        key = (kind, id(obj))
        known = self._encoded.get(key)
        if known is not None and known[0] is obj:
            return known[1]
        encoded = _encoder.encode({"type": kind, "object": obj})
        if len(self._encoded) >= _ENCODED_KEPT:
            self._encoded.clear()
        self._encoded[key] = (obj, encoded)
        return encoded

    async def _watch(self, request: web.BaseRequest, rt: ResourceType, ns: str | None) -> web.StreamResponse:
        cluster = self.cluster
        query = request.query
        labels, fields = cluster.selectors(rt, query.get("labelSelector"), query.get("fieldSelector"))
        timeout = self._int(query.get("timeoutSeconds"), "timeoutSeconds")
        bookmarks = _truthy(query.get("allowWatchBookmarks"))
        as_table = _wants_table(request.headers.get("Accept", ""))
        include = query.get("includeObject", "Metadata")
        response = web.StreamResponse(status=200, headers={"Content-Type": _JSON})
        response.enable_chunked_encoding()
        try:
            stream = cluster.watch(
                rt,
                ns,
                resource_version=query.get("resourceVersion"),
                labels=labels,
                fields=fields,
                send_initial_events=_truthy(query.get("sendInitialEvents")),
                bookmarks=bookmarks,
            )
        except ApiError as exc:
            if exc.code != 410:
                raise
            await response.prepare(request)
            await response.write(_encoder.encode({"type": "ERROR", "object": exc.status()}) + b"\n")
            await response.write_eof()
            return response
        await response.prepare(request)
        loop = asyncio.get_running_loop()
        wake = asyncio.Event()
        stream.wake = wake.set
        self._watches.add(stream)
        end_at = loop.time() + timeout if timeout else None
        next_bookmark = loop.time() + self.bookmark_seconds
        first_table = True
        written_at = -_WATCH_BATCH_S
        try:
            while True:
                if stream.pending:
                    wait = written_at + _WATCH_BATCH_S - loop.time()
                    if wait > 0 and not stream.ended and not self._stopping:
                        await asyncio.sleep(wait)  # let the events of this moment gather
                    chunks: list[bytes] = []
                    while stream.pending and len(chunks) < _CHUNK:
                        kind, obj = stream.pending.popleft()
                        if as_table and kind != BOOKMARK:
                            obj = table(
                                rt, [obj], now=cluster.now(), include=include, with_columns=first_table
                            )
                            first_table = False
                            chunks.append(_encoder.encode({"type": kind, "object": obj}))
                        else:
                            chunks.append(self._event_bytes(kind, obj))
                    await response.write(b"\n".join(chunks) + b"\n")
                    written_at = loop.time()
                    continue
                transport = request.transport
                if stream.ended or self._stopping or transport is None or transport.is_closing():
                    break
                now = loop.time()
                if end_at is not None and now >= end_at:
                    break
                if bookmarks and now >= next_bookmark:
                    stream.pending.append((BOOKMARK, stream.bookmark()))
                    next_bookmark = now + self.bookmark_seconds
                    continue
                # Wake up now and then even when idle, to notice a client that went away.
                wait = min(next_bookmark - now if bookmarks else self.liveness_seconds, self.liveness_seconds)
                if end_at is not None:
                    wait = min(wait, end_at - now)
                wake.clear()
                try:
                    async with asyncio.timeout(wait):
                        await wake.wait()
                except TimeoutError:
                    pass
        except ConnectionResetError:
            return response
        finally:
            stream.close()
            self._watches.discard(stream)
            self.watch_ended.set()
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response
