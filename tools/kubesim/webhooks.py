"""Admission webhooks, the calling part: POSTs each matching webhook an AdmissionReview and folds the answers
into the request, as the real API server's admission chain does.

The server (`tools.kubesim.server`) awaits `Webhooks.admit` on every create, update and delete after the
cluster has prepared the object (`Cluster.begin_*`) and before it stores it (`Cluster.finish`). Which
webhooks match, what is sent and what an answer means are pure (`tools.kubesim.admission`); this module
only does the HTTP, with one aiohttp session per server (closed by `close`), per-webhook
`timeoutSeconds`, and TLS verified against the webhook's `caBundle` (the system's roots without one).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import ssl
import uuid
from typing import Any

import aiohttp
import msgspec

from tools.kubesim import admission
from tools.kubesim.admission import MUTATING, VALIDATING, Attributes, Hook, WebhookCallError

__all__ = ["Admitted", "Webhooks"]

Obj = dict[str, Any]
log = logging.getLogger("kubesim")

_REVIEW = msgspec.json.Encoder()
"""AdmissionReviews go out encoded by msgspec (one per pod created: the stdlib encoder was a visible part
of the simulated API server's CPU)."""
_JSON_BODY = {"Content-Type": "application/json"}


class Admitted:
    """What admission made of a request: the (possibly mutated) object and the warnings to pass on."""

    def __init__(self, obj: Obj | None, warnings: list[str], called: bool) -> None:
        self.obj = obj
        self.warnings = warnings
        self.called = called
        """Whether any webhook was called (when none was, the request went on without waiting)."""


class Webhooks:
    """The admission chain of one simulated API server."""

    def __init__(self, store: Any) -> None:
        self._store = store
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    def configured(self) -> bool:
        """Whether any webhook configuration exists (none: every request skips admission at no cost)."""
        return any(self._store.storage(key).count for key in (MUTATING, VALIDATING))

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def admit(self, attrs: Attributes) -> Admitted:
        """Run the mutating webhooks in order, then the validating ones (concurrently, as the real server);
        returns the admitted object or raises the `ApiError` the request fails with."""
        if not self.configured():
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
        url = config.get("url")
        if url is None:
            svc = config.get("service") or {}
            raise WebhookCallError(
                f'service "{svc.get("namespace", "")}/{svc.get("name", "")}" cannot be reached: '
                "kubesim has no cluster network (give clientConfig.url instead)"
            )
        # The real server tells the webhook its deadline the same way.
        target = f"{url}{'&' if '?' in url else '?'}timeout={timeout}s"
        try:
            async with self._client().post(
                target,
                data=_REVIEW.encode(admission.review(attrs, uid)),
                headers=_JSON_BODY,
                timeout=aiohttp.ClientTimeout(total=timeout),
                ssl=self._ssl_for(config) if str(url).startswith("https:") else False,
            ) as response:
                raw = await response.read()
                status = response.status
        except TimeoutError as exc:
            raise WebhookCallError(
                f'failed to call webhook: Post "{target}": context deadline exceeded'
            ) from exc
        except (aiohttp.ClientError, ssl.SSLError, OSError, ValueError) as exc:
            raise WebhookCallError(f'failed to call webhook: Post "{target}": {exc}') from exc
        if not 200 <= status < 300:
            detail = raw[:200].decode(errors="replace")
            raise WebhookCallError(
                f"failed to call webhook: the server responded with the status code {status} ({detail})"
            )
        return admission.verdict(hook, raw, uid)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession()
        return self._session

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
