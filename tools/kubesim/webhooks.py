"""Admission webhooks, the calling part: POSTs each matching webhook an AdmissionReview and folds the answers
into the request, as the real API server's admission chain does.

The server (`tools.kubesim.server`) awaits `Webhooks.admit` on every create, update and delete after the
cluster has prepared the object (`Cluster.begin_*`) and before it stores it (`Cluster.finish`). Which
webhooks match, what is sent and what an answer means are pure (`tools.kubesim.admission`); this module
only does the HTTP, with one keep-alive client per server (`tools.kubesim.webhook_client`, closed by
`close`), per-webhook `timeoutSeconds`, and TLS verified against the webhook's `caBundle` (the system's roots without one).

A webhook given by `clientConfig.service` is called at one ready endpoint of that Service per request
(`admission.service_endpoints`, read from the store at each call, so a slice rewritten takes effect at
once): the endpoints in turn, round robin per Service and port, as a Service spreads its clients' requests
over its backends. When one refuses the connection, or closes it without an answer (a replica that
stopped), the next is tried (webhooks declare no side effects), and the webhook's `failurePolicy` applies
only when none of them answers (a departure: the real server calls
one endpoint per request and fails on its refusal; a cluster's readiness probe would soon have taken that
endpoint out of the slice).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import uuid
from dataclasses import dataclass
from typing import Any

import msgspec

from tools.kubesim import admission
from tools.kubesim.admission import MUTATING, VALIDATING, Attributes, Hook, WebhookCallError
from tools.kubesim.resources import ResourceType
from tools.kubesim.webhook_client import ReviewClient, UnreachableError

__all__ = ["Admitted", "Webhooks"]

Obj = dict[str, Any]
log = logging.getLogger("kubesim")

_REVIEW = msgspec.json.Encoder()
"""AdmissionReviews go out encoded by msgspec (one per pod created: the stdlib encoder was a visible part
of the simulated API server's CPU)."""


class Admitted:
    """What admission made of a request: the (possibly mutated) object and the warnings to pass on."""

    def __init__(self, obj: Obj | None, warnings: list[str], called: bool) -> None:
        self.obj = obj
        self.warnings = warnings
        self.called = called
        """Whether any webhook was called (when none was, the request went on without waiting)."""


_SERVICES = "services"
_ENDPOINT_SLICES = "discovery.k8s.io/endpointslices"


@dataclass(frozen=True)
class _Target:
    """Where one try of a call goes: the URL, and for https the name its certificate must carry."""

    url: str
    server_hostname: str | None = None


class Webhooks:
    """The admission chain of one simulated API server."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._client = ReviewClient()
        self._ssl: dict[str, ssl.SSLContext] = {}
        self._turn: dict[tuple[str, str, int], int] = {}
        """Per Service and port, how many calls it has had: the endpoint the next one starts at."""
        self._configurations = (store.storage(MUTATING), store.storage(VALIDATING))
        self._routes: dict[tuple[Any, ...], bool] = {}
        """Per (operation, resource, subresource, equivalents), whether some webhook has a rule for it
        (`routed`); forgotten whenever a webhook configuration is written."""
        for storage in self._configurations:
            storage.listeners.append(self._forget_routes)

    def configured(self) -> bool:
        """Whether any webhook configuration exists (none: every request skips admission at no cost)."""
        mutating, validating = self._configurations
        return bool(mutating.count or validating.count)

    def routed(
        self,
        operation: str,
        rt: ResourceType,
        subresource: str = "",
        equivalents: tuple[tuple[str, str, str], ...] = (),
    ) -> bool:
        """Whether a request like this may go to some webhook (`admission.routed`, remembered until a
        configuration changes): when not, the server stores the write without building a review."""
        mutating, validating = self._configurations
        if not (mutating.count or validating.count):
            return False
        key = (operation, rt.group, rt.version, rt.plural, rt.namespaced, subresource, equivalents)
        known = self._routes.get(key)
        if known is None:
            known = admission.routed(
                [*mutating.iter(), *validating.iter()], operation, rt, subresource, equivalents
            )
            self._routes[key] = known
        return known

    def _forget_routes(self, _change: Any) -> None:
        self._routes.clear()

    async def close(self) -> None:
        await self._client.close()

    async def admit(self, attrs: Attributes) -> Admitted:
        """Run the mutating webhooks in order, then the validating ones (concurrently, as the real server);
        returns the admitted object or raises the `ApiError` the request fails with."""
        if not self.routed(attrs.operation, attrs.rt, attrs.subresource, attrs.equivalents):
            return Admitted(attrs.obj, [], False)
        ns_labels = self._namespace_labels(attrs)
        warnings: list[str] = []
        called = False
        obj = attrs.obj
        mutating = admission.matching(self._configs(MUTATING), attrs, ns_labels, mutating=True)
        produced: list[tuple[Hook, Obj | None]] = []
        for hook in mutating:
            called = True
            obj = await self._mutate(hook, attrs, obj, warnings)
            produced.append((hook, obj))
        # reinvocationPolicy IfNeeded: called once more when a later webhook changed the object after it.
        for hook, after in produced:
            if hook.spec.get("reinvocationPolicy") == "IfNeeded" and obj != after:
                obj = await self._mutate(hook, attrs, obj, warnings)
        current = Attributes(**{**attrs.__dict__, "obj": obj})
        validating = admission.matching(self._configs(VALIDATING), current, ns_labels, mutating=False)
        if validating:
            called = True
            results = await asyncio.gather(*(self._call(hook, current) for hook in validating))
            for hook, result in zip(validating, results, strict=True):
                if result is not None:
                    warnings.extend(result.warnings)
                    if not result.allowed:
                        raise admission.denied(hook, result.status)
        return Admitted(obj, warnings, called)

    async def _mutate(
        self, hook: Hook, attrs: Attributes, obj: Obj | None, warnings: list[str]
    ) -> Obj | None:
        result = await self._call(hook, Attributes(**{**attrs.__dict__, "obj": obj}))
        if result is None:
            return obj
        warnings.extend(result.warnings)
        if not result.allowed:
            raise admission.denied(hook, result.status)
        if result.patch is None or obj is None:
            return obj
        try:
            return admission.patched(obj, result.patch)
        except WebhookCallError as exc:
            return self._failure(hook, str(exc), obj)

    def _failure(self, hook: Hook, why: str, obj: Obj | None) -> Obj | None:
        if hook.spec.get("failurePolicy", "Fail") == "Ignore":
            log.warning('kubesim: failed calling webhook "%s" (failurePolicy Ignore): %s', hook.name, why)
            return obj
        raise admission.failed(hook, why)

    async def _call(self, hook: Hook, attrs: Attributes) -> admission.Verdict | None:
        """One webhook's verdict; None when the call failed and its failurePolicy is Ignore."""
        try:
            return await self._post(hook, attrs)
        except WebhookCallError as exc:
            if hook.spec.get("failurePolicy", "Fail") == "Ignore":
                log.warning('kubesim: failed calling webhook "%s" (failurePolicy Ignore): %s', hook.name, exc)
                return None
            raise admission.failed(hook, str(exc)) from exc

    async def _post(self, hook: Hook, attrs: Attributes) -> admission.Verdict:
        uid = str(uuid.uuid4())
        config = hook.spec.get("clientConfig") or {}
        timeout = int(hook.spec.get("timeoutSeconds", admission.DEFAULT_TIMEOUT_S))
        body = _REVIEW.encode(admission.review(attrs, uid))
        targets = self._targets(config)
        deadline = asyncio.get_running_loop().time() + timeout
        for index, target in enumerate(targets):
            # The real server tells the webhook its deadline the same way.
            url = f"{target.url}{'&' if '?' in target.url else '?'}timeout={timeout}s"
            left = max(0.001, deadline - asyncio.get_running_loop().time())
            try:
                async with asyncio.timeout(left):
                    raw, status = await self._client.post(
                        url,
                        body,
                        ssl_context=self._ssl_for(config) if url.startswith("https:") else None,
                        server_hostname=target.server_hostname,
                    )
            except UnreachableError as exc:
                # Refused, unreachable, or gone before answering (a pooled connection to a replica that
                # stopped): another endpoint may take the review (webhooks declare no side effects).
                if index + 1 < len(targets):
                    continue
                raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from exc
            except TimeoutError as exc:
                raise WebhookCallError(
                    f'failed to call webhook: Post "{url}": context deadline exceeded'
                ) from exc
            except (ssl.SSLError, OSError, ValueError) as exc:
                raise WebhookCallError(f'failed to call webhook: Post "{url}": {exc}') from exc
            if not 200 <= status < 300:
                detail = raw[:200].decode(errors="replace")
                raise WebhookCallError(
                    f"failed to call webhook: the server responded with the status code {status} ({detail})"
                )
            return admission.verdict(hook, raw, uid)
        raise AssertionError("unreachable: _targets returns at least one target")

    def _targets(self, config: Obj) -> list[_Target]:
        """Where to POST, in the order to try: the `url`, or the Service's ready endpoints starting at the
        one whose turn it is. `WebhookCallError` when the Service has none."""
        url = config.get("url")
        if url is not None:
            return [_Target(str(url))]
        reference = config.get("service") or {}
        namespace, name = str(reference.get("namespace", "")), str(reference.get("name", ""))
        service = self._store.storage(_SERVICES).get(namespace, name)
        slices = self._store.storage(_ENDPOINT_SLICES).iter(namespace)
        endpoints = admission.service_endpoints(reference, service, slices)
        key = (namespace, name, int(reference.get("port", admission.DEFAULT_SERVICE_PORT)))
        turn = self._turn.get(key, 0)
        self._turn[key] = turn + 1
        start = turn % len(endpoints)
        host = admission.service_host(reference)
        urls = [
            admission.endpoint_url(reference, endpoint) for endpoint in endpoints[start:] + endpoints[:start]
        ]
        return [_Target(url, host if url.startswith("https:") else None) for url in urls]

    def _ssl_for(self, config: Obj) -> ssl.SSLContext:
        ca = str(config.get("caBundle") or "")
        context = self._ssl.get(ca)
        if context is None:
            try:
                cadata = base64.b64decode(ca).decode() if ca else None
                context = ssl.create_default_context(cadata=cadata)
            except (ValueError, ssl.SSLError) as exc:
                raise WebhookCallError(
                    f"clientConfig.caBundle is not a PEM certificate bundle: {exc}"
                ) from exc
            self._ssl[ca] = context
        return context

    def _configs(self, storage: str) -> list[Obj]:
        return list(self._store.storage(storage).iter())

    def _namespace_labels(self, attrs: Attributes) -> dict[str, str] | None:
        if not attrs.rt.namespaced:
            return None
        ns = self._store.storage("namespaces").get("", attrs.namespace)
        labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
        return dict(labels)
