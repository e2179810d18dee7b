"""One Kubernetes API connection through kubernetes-asyncio, and the one place its errors are translated.

Used by the state service (informers, the pod-grouper, write-back) and the binder (bindings, evictions).
`connect(kubeconfig)` loads a kubeconfig file (the simulated API server's, or a real cluster's) or, given
none inside a pod, the in-cluster service account. Calls go through kubernetes-asyncio's generated API
methods with `_preload_content=False`: the raw body is decoded by `shared.kube.wire` (msgspec, much faster
than the generated models) and a non-2xx answer does not raise inside the library (stack-notes: the
binding call raises ValueError *after* the server bound the pod when it tries to read the Status as a
V1Binding). The calls made for every pod go through `request` instead: the same session, authentication
and TLS, a body encoded by msgspec, none of the generated client's per-call work.

`call` turns every outcome into bytes or an `ApiError` that names the object and says whether asking again
may help (`temporary`: no answer, 429, 5xx, except a PodDisruptionBudget's refusal of an eviction, which
holds until the cluster changes: `budget`); `call_with_retries` retries the temporary ones with backoff
and raises `TemporaryError` when they run out.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import random
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import aiohttp
import msgspec
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.config import ConfigException, load_incluster_config, load_kube_config
from yarl import URL

from shared.backoff import Backoff
from shared.errors import ConfigError, KairosError, TemporaryError

log = logging.getLogger("kairos.kubeapi")

REQUEST_TIMEOUT = 30.0
"""Seconds one ordinary API call may take before it counts as no answer."""
TEMPORARY_STATUSES = frozenset({429, 500, 502, 503, 504})
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
NO_ANSWER = 0
"""The `status` of an ApiError raised when the server could not be reached or did not answer."""
TOO_MANY_REQUESTS = 429
INTERNAL_ERROR = 500
DISRUPTION_BUDGET_CAUSE = "DisruptionBudget"
"""The Status cause (policy/v1 DisruptionBudgetCause) the Eviction API names a refusing budget with."""
MULTIPLE_BUDGETS = "This pod has more than one PodDisruptionBudget"
"""How the Eviction API's 500 for a pod that several budgets select begins."""


class StatusCause(msgspec.Struct, frozen=True):
    """One cause of a metav1 Status (`details.causes[]`)."""

    reason: str = ""
    message: str = ""
    field: str = ""


class ApiError(KairosError):
    """The API server refused a call (status >= 300) or could not be reached (`status` 0).

    `what` names the object ("pods default/train-0"), `reason` is the Status reason (Conflict, NotFound,
    AlreadyExists, Expired, TooManyRequests...) when the server sent one.
    """

    def __init__(
        self, what: str, status: int, reason: str, message: str, causes: tuple[StatusCause, ...] = ()
    ) -> None:
        self.what = what
        self.status = status
        self.reason = reason
        self.message = message
        self.causes = causes
        answer = f"{status} {reason}".strip() if status else "no answer"
        super().__init__(f"{what}: {answer}: {message}" if message else f"{what}: {answer}")

    @property
    def temporary(self) -> bool:
        """Whether asking again at once may succeed: no answer, throttling (429) or a server error, but not
        a disruption budget's refusal (`budget`), which holds until the budget's pods change."""
        if self.budget:
            return False
        return self.status == NO_ANSWER or self.status in TEMPORARY_STATUSES

    @property
    def budget(self) -> str:
        """What a PodDisruptionBudget said when it refused an eviction, "" for any other answer: the Eviction
        API's 429 with a DisruptionBudget cause (the message and the cause, which names the budget:
        "... The disruption budget web needs 2 healthy pods and has 2 currently"), or its 500 for a pod
        that several budgets select. A 429 without such a cause is API Priority and Fairness throttling."""
        if self.status == TOO_MANY_REQUESTS:
            said = [c.message for c in self.causes if c.reason == DISRUPTION_BUDGET_CAUSE]
            if said:
                return " ".join([self.message, *said]).strip()
        if self.status == INTERNAL_ERROR and self.message.startswith(MULTIPLE_BUDGETS):
            return self.message
        return ""


class _Details(msgspec.Struct):
    causes: tuple[StatusCause, ...] = ()


class _Status(msgspec.Struct):
    """The part of a metav1 Status the error needs."""

    reason: str = ""
    message: str = ""
    details: _Details | None = None


_STATUS = msgspec.json.Decoder(_Status)


_PLAIN_PATH = re.compile(r"(?:/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)*")
"""A path with nothing to quote or normalise (no query, no escapes, no `..` segment to resolve is possible
without a dot-only segment, which Kubernetes names cannot be): the paths of the calls made for every pod."""


@functools.lru_cache(maxsize=8)
def _timeout(total: float) -> aiohttp.ClientTimeout:
    """The aiohttp timeout of `total` seconds, one object per value rather than one per call."""
    return aiohttp.ClientTimeout(total=total)


def api_error(what: str, status: int, body: bytes) -> ApiError:
    """The ApiError for a non-2xx answer; the Status's reason, message and causes when the body is one."""
    try:
        parsed = _STATUS.decode(body)
    except msgspec.DecodeError:  # a ValidationError too: a body that is not a Status
        parsed = _Status(message=body[:200].decode(errors="replace").strip())
    causes = parsed.details.causes if parsed.details is not None else ()
    return ApiError(what, status, parsed.reason, parsed.message, causes)


@dataclass
class Kube:
    """A connected API client plus the typed API groups Kairos calls."""

    api: k8s.ApiClient
    server: str
    core: k8s.CoreV1Api = field(init=False)
    custom: k8s.CustomObjectsApi = field(init=False)
    scheduling: k8s.SchedulingV1Api = field(init=False)
    batch: k8s.BatchV1Api = field(init=False)

    def __post_init__(self) -> None:
        self.core = k8s.CoreV1Api(self.api)
        self.custom = k8s.CustomObjectsApi(self.api)
        self.scheduling = k8s.SchedulingV1Api(self.api)
        self.batch = k8s.BatchV1Api(self.api)
        rest = self.api.rest_client
        self._session: aiohttp.ClientSession = rest.pool_manager
        self._options: dict[str, Any] = {}
        """The generated client's proxy and TLS server name settings, passed on every `request`."""
        if rest.proxy:
            self._options["proxy"] = rest.proxy
        if rest.proxy_headers:
            self._options["proxy_headers"] = rest.proxy_headers
        if rest.server_hostname:
            self._options["server_hostname"] = rest.server_hostname

    async def close(self) -> None:
        await self.api.close()

    async def call(
        self,
        what: str,
        method: Callable[..., Awaitable[Any]],
        *args: Any,
        timeout: float = REQUEST_TIMEOUT,
        **kwargs: Any,
    ) -> bytes:
        """Call a generated API method raw; the body on 2xx, else `ApiError` (translated here, once)."""
        try:
            response = await method(*args, _preload_content=False, _request_timeout=timeout, **kwargs)
            async with response:
                body: bytes = await response.read()
                status = int(response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(what, NO_ANSWER, type(exc).__name__, str(exc)) from exc
        except k8s.ApiException as exc:  # raised for a few client-side problems even without preloading
            raise ApiError(
                what, int(exc.status or NO_ANSWER), str(exc.reason or ""), str(exc.body or "")
            ) from exc
        if status >= 300:
            raise api_error(what, status, body)
        return body

    async def request(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = JSON,
        timeout: float = REQUEST_TIMEOUT,
    ) -> bytes:
        """One call on `path` with `body` encoded by msgspec; the answer's body on 2xx, else `ApiError`, as
        `call`. For the calls made for every pod (Events, status patches, bindings, owner reads): it goes
        through the generated client's session, authentication, TLS and proxy settings, but not through its
        per-call body sanitising, stdlib JSON encoding and parameter handling, which cost more CPU than the
        HTTP exchange itself (docs/performance.md)."""
        headers = {"Accept": JSON, "Content-Type": content_type, **self.api.default_headers}
        queries: list[tuple[str, str]] = []
        await self.api.update_params_for_auth(headers, queries, ["BearerToken"])
        url: str | URL = self.server + path
        if queries:
            url = f"{url}{'&' if '?' in path else '?'}{urlencode(queries)}"
        elif _PLAIN_PATH.fullmatch(path):
            # Already as sent: aiohttp would otherwise parse, quote and normalise it (a quarter of a call).
            url = URL(url, encoded=True)
        data = None if body is None else msgspec.json.encode(body)
        try:
            async with self._session.request(
                method, url, data=data, headers=headers, timeout=_timeout(timeout), **self._options
            ) as response:
                answer = await response.read()
                status = int(response.status)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(what, NO_ANSWER, type(exc).__name__, str(exc)) from exc
        if status >= 300:
            raise api_error(what, status, answer)
        return answer

    async def call_with_retries(
        self,
        what: str,
        method: Callable[..., Awaitable[Any]],
        *args: Any,
        backoff: Backoff,
        rng: random.Random | None = None,
        **kwargs: Any,
    ) -> bytes:
        """`call`, retrying temporary errors with `backoff`; `TemporaryError` when the attempts run out."""
        return await _with_retries(what, lambda: self.call(what, method, *args, **kwargs), backoff, rng)

    async def request_with_retries(
        self,
        what: str,
        method: str,
        path: str,
        body: Any = None,
        *,
        backoff: Backoff,
        rng: random.Random | None = None,
        on_retry: Callable[[], None] | None = None,
        content_type: str = JSON,
    ) -> bytes:
        """`request`, retrying temporary errors as `call_with_retries` does; `on_retry` is told of each
        attempt after the first."""
        attempts = 0

        async def attempt() -> bytes:
            nonlocal attempts
            if attempts and on_retry is not None:
                on_retry()
            attempts += 1
            return await self.request(what, method, path, body, content_type=content_type)

        return await _with_retries(what, attempt, backoff, rng)


async def _with_retries(
    what: str, attempt: Callable[[], Awaitable[bytes]], backoff: Backoff, rng: random.Random | None
) -> bytes:
    rng = rng or random.Random()
    last: ApiError | None = None
    for number in range(max(1, backoff.attempts)):
        if number:
            await asyncio.sleep(backoff.delay(number - 1, rng))
        try:
            return await attempt()
        except ApiError as exc:
            if not exc.temporary:
                raise
            last = exc
            log.debug("%s: attempt %d: %s", what, number + 1, exc)
    raise TemporaryError(f"{last} (after {backoff.attempts} attempts)", delay=backoff.cap) from last


async def connect(kubeconfig: str | None) -> Kube:
    """A client for the cluster in `kubeconfig`, or the in-cluster service account when it is None.

    A missing or unreadable kubeconfig, or no kubeconfig outside a pod, is a ConfigError naming it.
    """
    configuration = k8s.Configuration()
    try:
        if kubeconfig:
            if not os.path.isfile(kubeconfig):  # noqa: ASYNC240 -- once, at start-up
                raise ConfigError(f"kubeconfig {kubeconfig!r}: no such file")
            await load_kube_config(
                config_file=kubeconfig, client_configuration=configuration, persist_config=False
            )
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        else:
            raise ConfigError(
                "no kubeconfig given and not running in a pod: pass --set kubeconfig=FILE (or KUBECONFIG)"
            )
    except (ConfigException, OSError, ValueError, TypeError, KeyError) as exc:
        where = f"kubeconfig {kubeconfig!r}" if kubeconfig else "in-cluster config"
        raise ConfigError(f"{where}: {exc}") from exc
    if configuration.proxy is None:
        with contextlib.suppress(LookupError, ValueError):
            configuration.proxy = str(get_env_proxy_for_url(URL(str(configuration.host)))[0])
    api = k8s.ApiClient(configuration)
    # Trusting the environment, aiohttp reads ~/.netrc and the proxy variables in a worker thread on every
    # request (a fifth of the binder's CPU while it binds); the proxy was read once just above, and
    # credentials come from the kubeconfig, never from netrc.
    api.rest_client.pool_manager._trust_env = False
    return Kube(api, str(configuration.host))
