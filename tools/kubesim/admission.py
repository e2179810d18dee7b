"""Admission webhooks, the pure part: what a Mutating/ValidatingWebhookConfiguration may hold, which of its
webhooks a request goes to, the AdmissionReview sent, and what the answer does to the request.

`tools.kubesim.kinds` calls `validate_configuration` and `default_configuration` when a configuration is
written; `tools.kubesim.webhooks` (the HTTP caller, run by the server before the store operation) calls
`matching` for the webhooks of a request, `review` for the body it POSTs, `verdict` on the answer and
`patched` for a mutating webhook's JSON patch. No I/O here.

As the real API server (admission.k8s.io/v1 only): mutating webhooks run one after the other in name order
of their configurations, then webhook order, and validating ones after them; a rule's `resources` entry
`pods` does not match `pods/status` (`pods/*` and `*/*` do); `namespaceSelector` reads the labels of the
request's namespace (of the object itself for a Namespace; never skips other cluster-scoped objects);
`objectSelector` matches the new or the old object's labels.

A `clientConfig.service` (namespace, name, port 443 by default, path) is resolved as the API server's
endpoint resolver does, through the Service's endpoints (`service_endpoints`): the Service must exist and
declare that `port`, and the call goes to one ready endpoint of its EndpointSlices (label
`kubernetes.io/service-name`) at the slice port named as the Service's port, so each request reaches one
replica behind it. No Service, no such port, no endpoint or none ready: the call fails under the webhook's
`failurePolicy`.

Kubesim departs from the real server in three places, each written down where it applies:
`clientConfig.url` may be plain `http` (a real server accepts only `https`); a Service's endpoints on a
loopback address are called over plain `http` too (`endpoint_url`; others over `https`, verified against
`caBundle` for the name `<service>.<namespace>.svc`); and `tools.kubesim.webhooks` takes the ready
endpoints in turn and tries the next when one refuses the connection (the real server picks one at random
and fails the call when it refuses; a cluster's readiness probes would soon have taken it out of the slice,
which kubesim has no kubelet for).
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import msgspec

from tools.kubesim.errors import ApiError, invalid
from tools.kubesim.objects import meta
from tools.kubesim.patch import PatchError, json_patch
from tools.kubesim.resources import ResourceType
from tools.kubesim.selectors import label_selector_of

__all__ = [
    "MUTATING",
    "VALIDATING",
    "Attributes",
    "Endpoint",
    "Hook",
    "Verdict",
    "WebhookCallError",
    "default_configuration",
    "denied",
    "endpoint_url",
    "failed",
    "matching",
    "patched",
    "review",
    "routed",
    "service_endpoints",
    "service_host",
    "validate_configuration",
    "verdict",
]

Obj = dict[str, Any]

MUTATING = "admissionregistration.k8s.io/mutatingwebhookconfigurations"
VALIDATING = "admissionregistration.k8s.io/validatingwebhookconfigurations"
_KIND = {MUTATING: "MutatingWebhookConfiguration", VALIDATING: "ValidatingWebhookConfiguration"}
_OPERATIONS = frozenset(("CREATE", "UPDATE", "DELETE", "CONNECT", "*"))
_SIDE_EFFECTS = ("None", "NoneOnDryRun")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DEFAULT_TIMEOUT_S = 10
"""The real server's default `timeoutSeconds` for admissionregistration.k8s.io/v1."""
DEFAULT_SERVICE_PORT = 443
"""A `clientConfig.service` without a `port` is called on the Service's port 443."""
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
"""The label naming the Service an EndpointSlice belongs to."""
USER_INFO: Obj = {"username": "kubesim-admin", "groups": ["system:masters", "system:authenticated"]}
"""Who every request comes from (kubesim authenticates nobody; the same user SelfSubjectReview reports)."""


class WebhookCallError(Exception):
    """A webhook could not be called or answered wrongly: the request fails or goes on per `failurePolicy`."""


# --- configurations --------------------------------------------------------------------------------------
def default_configuration(storage: str, obj: Obj) -> None:
    """The defaults the real server fills into each webhook of a configuration (in place; create and update)."""
    for hook in obj.get("webhooks") or ():
        if not isinstance(hook, dict):
            continue
        hook.setdefault("failurePolicy", "Fail")
        hook.setdefault("matchPolicy", "Equivalent")
        hook.setdefault("namespaceSelector", {})
        hook.setdefault("objectSelector", {})
        hook.setdefault("timeoutSeconds", DEFAULT_TIMEOUT_S)
        if storage == MUTATING:
            hook.setdefault("reinvocationPolicy", "Never")
        for rule in hook.get("rules") or ():
            if isinstance(rule, dict):
                rule.setdefault("scope", "*")


def validate_configuration(storage: str, obj: Obj) -> None:
    """422 Invalid, naming the field, for a configuration the real server would refuse (after defaults)."""
    kind = _KIND[storage]
    name = meta(obj).get("name", "")
    hooks = obj.get("webhooks") or []
    if not isinstance(hooks, list):
        raise invalid(kind, name, "webhooks", "must be a list")
    seen: set[str] = set()
    for i, hook in enumerate(hooks):
        at = f"webhooks[{i}]"
        if not isinstance(hook, dict):
            raise invalid(kind, name, at, "must be an object")
        hook_name = hook.get("name")
        if (
            not isinstance(hook_name, str)
            or _DNS_SUBDOMAIN.match(hook_name) is None
            or hook_name.count(".") < 2
        ):
            raise invalid(
                kind,
                name,
                f"{at}.name",
                "should be a domain with at least three segments separated by dots",
                value=hook_name,
            )
        if hook_name in seen:
            raise invalid(kind, name, f"{at}.name", "Duplicate value", value=hook_name)
        seen.add(hook_name)
        _validate_client_config(kind, name, at, hook.get("clientConfig"))
        for j, rule in enumerate(hook.get("rules") or ()):
            _validate_rule(kind, name, f"{at}.rules[{j}]", rule)
        if hook.get("sideEffects") not in _SIDE_EFFECTS:
            raise invalid(
                kind,
                name,
                f"{at}.sideEffects",
                'Unsupported value: supported values: "None", "NoneOnDryRun"',
                value=hook.get("sideEffects"),
            )
        versions = hook.get("admissionReviewVersions")
        if not isinstance(versions, list) or "v1" not in versions:
            # The real server also takes v1beta1; kubesim speaks only v1, so it must be offered.
            raise invalid(
                kind,
                name,
                f"{at}.admissionReviewVersions",
                "must include at least one of v1 (the only version kubesim sends)",
                value=versions,
            )
        for key, allowed in (
            ("failurePolicy", ("Ignore", "Fail")),
            ("matchPolicy", ("Exact", "Equivalent")),
            *((("reinvocationPolicy", ("Never", "IfNeeded")),) if storage == MUTATING else ()),
        ):
            if hook.get(key) not in allowed:
                raise invalid(
                    kind,
                    name,
                    f"{at}.{key}",
                    "Unsupported value: supported values: " + ", ".join(f'"{a}"' for a in allowed),
                    value=hook.get(key),
                )
        timeout = hook.get("timeoutSeconds")
        if not isinstance(timeout, int) or isinstance(timeout, bool) or not 1 <= timeout <= 30:
            raise invalid(
                kind,
                name,
                f"{at}.timeoutSeconds",
                "the timeout value must be between 1 and 30 seconds",
                value=timeout,
            )
        for key in ("namespaceSelector", "objectSelector"):
            selector = hook.get(key)
            if not isinstance(selector, dict):
                raise invalid(kind, name, f"{at}.{key}", "must be a label selector object")
            try:
                label_selector_of(selector)
            except ApiError as exc:
                raise invalid(kind, name, f"{at}.{key}", exc.message) from exc


def _validate_client_config(kind: str, name: str, at: str, config: Any) -> None:
    if not isinstance(config, dict):
        raise invalid(kind, name, f"{at}.clientConfig", "Required value")
    url, service = config.get("url"), config.get("service")
    if (url is None) == (service is None):
        raise invalid(kind, name, f"{at}.clientConfig", "exactly one of url or service is required")
    if url is not None:
        parts = urlsplit(str(url))
        # Kubesim accepts http too (the real server only https): tests and `kairos up` run webhooks on
        # loopback without certificates.
        if parts.scheme not in ("https", "http") or not parts.hostname:
            raise invalid(
                kind,
                name,
                f"{at}.clientConfig.url",
                "'https' (or, in kubesim, 'http') URL with a host required",
                value=url,
            )
        if parts.fragment or parts.query:
            raise invalid(
                kind,
                name,
                f"{at}.clientConfig.url",
                "fragments and query parameters are not permitted",
                value=url,
            )
    if service is not None:
        _validate_service_reference(kind, name, f"{at}.clientConfig.service", service)
    ca = config.get("caBundle")
    if ca is not None:
        try:
            base64.b64decode(str(ca), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise invalid(kind, name, f"{at}.clientConfig.caBundle", f"not valid base64: {exc}") from exc


def _validate_service_reference(kind: str, name: str, at: str, service: Any) -> None:
    if not isinstance(service, dict):
        raise invalid(kind, name, at, "must be an object")
    for key in ("namespace", "name"):
        if not isinstance(service.get(key), str) or not service[key]:
            raise invalid(kind, name, f"{at}.{key}", f"Required value: service {key} is required")
    path = service.get("path")
    if path is not None and (not isinstance(path, str) or not path.startswith("/")):
        raise invalid(kind, name, f"{at}.path", "must start with a '/'", value=path)
    port = service.get("port", DEFAULT_SERVICE_PORT)
    if not isinstance(port, int) or isinstance(port, bool) or not 1 <= port <= 65535:
        raise invalid(kind, name, f"{at}.port", "port is not valid: must be between 1 and 65535", value=port)


def _validate_rule(kind: str, name: str, at: str, rule: Any) -> None:
    if not isinstance(rule, dict):
        raise invalid(kind, name, at, "must be an object")
    for key in ("operations", "apiGroups", "apiVersions", "resources"):
        value = rule.get(key)
        if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
            raise invalid(kind, name, f"{at}.{key}", "Required value: a non-empty list of strings")
    bad = [op for op in rule["operations"] if op not in _OPERATIONS]
    if bad:
        raise invalid(
            kind,
            name,
            f"{at}.operations",
            'Unsupported value: supported values: "*", "CONNECT", "CREATE", "DELETE", "UPDATE"',
            value=bad[0],
        )
    if rule.get("scope", "*") not in ("*", "Cluster", "Namespaced"):
        raise invalid(
            kind,
            name,
            f"{at}.scope",
            'Unsupported value: supported values: "*", "Cluster", "Namespaced"',
            value=rule.get("scope"),
        )


# --- which webhooks a request goes to ---------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Attributes:
    """One request as admission sees it (objects in the request's API version)."""

    operation: str
    """CREATE, UPDATE, DELETE."""
    rt: ResourceType
    subresource: str
    namespace: str
    name: str
    obj: Obj | None
    """The object written (the body of a subresource CREATE such as a Binding); None for DELETE."""
    old: Obj | None
    """The object before an UPDATE or DELETE."""
    dry_run: bool = False
    options: Obj | None = None
    kind: tuple[str, str, str] = ("", "", "")
    """(group, version, kind) of `obj`; the resource's own kind when empty."""
    equivalents: tuple[tuple[str, str, str], ...] = ()
    """(group, version, plural) of the other API versions serving the same resource (matchPolicy Equivalent)."""


@dataclass(frozen=True)
class Hook:
    """One webhook of a configuration."""

    configuration: str
    spec: Obj
    mutating: bool

    @property
    def name(self) -> str:
        return str(self.spec["name"])


def matching(
    configurations: list[Obj], attrs: Attributes, namespace_labels: dict[str, str] | None, *, mutating: bool
) -> list[Hook]:
    """The webhooks of `configurations` (one kind) that `attrs` goes to, in calling order."""
    return [
        Hook(str(meta(config)["name"]), spec, mutating)
        for config in sorted(configurations, key=lambda c: str(meta(c).get("name", "")))
        for spec in config.get("webhooks") or ()
        if _matches(spec, attrs, namespace_labels)
    ]


def routed(
    configurations: Iterable[Obj],
    operation: str,
    rt: ResourceType,
    subresource: str,
    equivalents: tuple[tuple[str, str, str], ...],
) -> bool:
    """Whether some webhook of `configurations` has a rule for this operation on this resource: the
    selectors aside, whether a request like it may have to be sent anywhere (most writes need not)."""
    return any(
        _rules_match(spec, operation, rt, subresource, equivalents)
        for config in configurations
        for spec in config.get("webhooks") or ()
    )


def _rules_match(
    spec: Obj,
    operation: str,
    rt: ResourceType,
    subresource: str,
    equivalents: tuple[tuple[str, str, str], ...],
) -> bool:
    targets = [(rt.group, rt.version, rt.plural)]
    if spec.get("matchPolicy", "Equivalent") == "Equivalent":
        targets.extend(equivalents)
    return any(
        _rule_matches(rule, operation, group, version, plural, subresource, rt.namespaced)
        for rule in spec.get("rules") or ()
        for group, version, plural in targets
    )


def _matches(spec: Obj, attrs: Attributes, namespace_labels: dict[str, str] | None) -> bool:
    rt = attrs.rt
    if not _rules_match(spec, attrs.operation, rt, attrs.subresource, attrs.equivalents):
        return False
    ns_selector = label_selector_of(spec.get("namespaceSelector") or {})
    if ns_selector:
        if rt.storage == "namespaces":
            own = attrs.obj if attrs.obj is not None else attrs.old
            if own is None or not ns_selector.matches(own):
                return False
        elif rt.namespaced and not ns_selector.matches({"metadata": {"labels": namespace_labels or {}}}):
            return False
    obj_selector = label_selector_of(spec.get("objectSelector") or {})
    if obj_selector:
        candidates = [o for o in (attrs.obj, attrs.old) if o is not None]
        if not any(obj_selector.matches(o) for o in candidates):
            return False
    return True


def _rule_matches(
    rule: Obj, operation: str, group: str, version: str, plural: str, subresource: str, namespaced: bool
) -> bool:
    ops = rule.get("operations") or ()
    if "*" not in ops and operation not in ops:
        return False
    groups = rule.get("apiGroups") or ()
    if "*" not in groups and group not in groups:
        return False
    versions = rule.get("apiVersions") or ()
    if "*" not in versions and version not in versions:
        return False
    scope = rule.get("scope", "*")
    if (scope == "Cluster" and namespaced) or (scope == "Namespaced" and not namespaced):
        return False
    return any(_resource_matches(entry, plural, subresource) for entry in rule.get("resources") or ())


def _resource_matches(entry: str, plural: str, subresource: str) -> bool:
    if entry == "*/*":
        return True
    res, _, sub = entry.partition("/")
    if res not in ("*", plural):
        return False
    if not _:
        # `pods` and `*` name the resource itself, never a subresource.
        return not subresource
    return sub in ("*", subresource) if subresource else sub == "*"


# --- where a clientConfig.service is called -----------------------------------------------------------------
@dataclass(frozen=True)
class Endpoint:
    """One ready endpoint of a webhook's Service: where the review is POSTed."""

    host: str
    port: int


def service_endpoints(reference: Obj, service: Obj | None, slices: Iterable[Obj]) -> list[Endpoint]:
    """The ready endpoints a `clientConfig.service` `reference` resolves to, in a stable order (slices by
    name, then as listed), given the Service it names (None: not found) and the EndpointSlices of its
    namespace; `WebhookCallError` saying why when there is none to call."""
    namespace, name = str(reference.get("namespace", "")), str(reference.get("name", ""))
    port = reference.get("port", DEFAULT_SERVICE_PORT)
    where = f'service "{namespace}/{name}"'
    if service is None:
        raise WebhookCallError(f"{where} not found")
    spec = service.get("spec")
    if not isinstance(spec, dict):
        spec = {}
    kind = spec.get("type") or "ClusterIP"
    if kind not in ("ClusterIP", "NodePort", "LoadBalancer"):
        raise WebhookCallError(f'{where}: unsupported service type "{kind}"')
    port_name = next(
        (
            str(p.get("name") or "")
            for p in _list(spec.get("ports"))
            if isinstance(p, dict) and p.get("port") == port
        ),
        None,
    )
    if port_name is None:
        raise WebhookCallError(f"no service port {port} found for {where}")
    ready: list[Endpoint] = []
    mine = [s for s in slices if ((meta(s).get("labels") or {}).get(SERVICE_NAME_LABEL)) == name]
    for slice_ in sorted(mine, key=lambda s: str(meta(s).get("name", ""))):
        target = next(
            (
                p.get("port")
                for p in _list(slice_.get("ports"))
                if isinstance(p, dict) and str(p.get("name") or "") == port_name
            ),
            None,
        )
        if not isinstance(target, int) or isinstance(target, bool):
            continue
        for endpoint in _list(slice_.get("endpoints")):
            if not isinstance(endpoint, dict):
                continue
            # An unknown readiness counts as ready (EndpointConditions: nil means ready).
            conditions = endpoint.get("conditions")
            if isinstance(conditions, dict) and conditions.get("ready") is False:
                continue
            addresses = endpoint.get("addresses")
            # The addresses of one endpoint are the same backend: consumers take the first.
            if isinstance(addresses, list) and addresses and isinstance(addresses[0], str):
                ready.append(Endpoint(addresses[0], target))
    if not ready:
        raise WebhookCallError(f"no endpoints available for {where}")
    return ready


def endpoint_url(reference: Obj, endpoint: Endpoint) -> str:
    """The URL a review for `reference` is POSTed to at `endpoint`: `https`, except that kubesim calls
    loopback endpoints over plain `http` (the `kairos up` replicas serve their webhooks without TLS)."""
    path = str(reference.get("path") or "/")
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    scheme = "http" if _loopback(endpoint.host) else "https"
    return f"{scheme}://{host}:{endpoint.port}{path}"


def service_host(reference: Obj) -> str:
    """The name a Service's TLS certificate is checked against: `<name>.<namespace>.svc`."""
    return f"{reference.get('name', '')}.{reference.get('namespace', '')}.svc"


def _list(value: Any) -> list[Any]:
    """A list field as written, or none (the Service and slices are stored as clients wrote them)."""
    return value if isinstance(value, list) else []


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# --- the call and its answer -------------------------------------------------------------------------------
def review(attrs: Attributes, uid: str) -> Obj:
    """The AdmissionReview (admission.k8s.io/v1) POSTed to a webhook."""
    rt = attrs.rt
    group, version, kind = attrs.kind if attrs.kind[2] else (rt.group, rt.version, rt.kind)
    resource = {"group": rt.group, "version": rt.version, "resource": rt.plural}
    gvk = {"group": group, "version": version, "kind": kind}
    request: Obj = {
        "uid": uid,
        "kind": gvk,
        "resource": resource,
        "requestKind": gvk,
        "requestResource": resource,
        "name": attrs.name,
        "operation": attrs.operation,
        "userInfo": USER_INFO,
        "object": attrs.obj,
        "oldObject": attrs.old,
        "dryRun": attrs.dry_run,
        "options": attrs.options,
    }
    if attrs.subresource:
        request["subResource"] = attrs.subresource
        request["requestSubResource"] = attrs.subresource
    if rt.namespaced:
        request["namespace"] = attrs.namespace
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


@dataclass(frozen=True)
class Verdict:
    """What a webhook answered: allowed or the Status it denied with, its patch and its warnings."""

    allowed: bool
    status: Obj = field(default_factory=dict)
    patch: list[Any] | None = None
    warnings: tuple[str, ...] = ()


def verdict(hook: Hook, body: bytes, uid: str) -> Verdict:
    """Read a webhook's answer; `WebhookCallError` when it is not a well-formed v1 AdmissionReview for `uid`."""
    try:
        doc = msgspec.json.decode(body)
    except msgspec.DecodeError as exc:
        raise WebhookCallError(f"received invalid webhook response: {exc}") from exc
    if (
        not isinstance(doc, dict)
        or doc.get("apiVersion") != "admission.k8s.io/v1"
        or doc.get("kind") != "AdmissionReview"
    ):
        raise WebhookCallError("expected webhook response of admission.k8s.io/v1, Kind=AdmissionReview")
    response = doc.get("response")
    if not isinstance(response, dict):
        raise WebhookCallError("webhook response was absent")
    if response.get("uid") != uid:
        raise WebhookCallError(f"expected response.uid={uid!r}, got {response.get('uid')!r}")
    warnings = tuple(str(w) for w in response.get("warnings") or () if w)
    status = response.get("status") if isinstance(response.get("status"), dict) else {}
    if not response.get("allowed"):
        return Verdict(False, status or {}, None, warnings)
    raw_patch = response.get("patch")
    if not hook.mutating or raw_patch in (None, ""):
        return Verdict(True, status or {}, None, warnings)
    if response.get("patchType") != "JSONPatch":
        raise WebhookCallError(f'unsupported patch type "{response.get("patchType")}"')
    try:
        ops = msgspec.json.decode(base64.b64decode(str(raw_patch), validate=True))
    except (binascii.Error, ValueError, msgspec.DecodeError) as exc:
        raise WebhookCallError(f"the patch is not base64-encoded JSON: {exc}") from exc
    if not isinstance(ops, list):
        raise WebhookCallError("the patch is not a JSON patch (a list of operations)")
    return Verdict(True, status or {}, ops, warnings)


def patched(obj: Obj, ops: list[Any]) -> Obj:
    """`obj` with a mutating webhook's JSON patch applied; `WebhookCallError` when it does not apply or changes
    the object's identity (kind, apiVersion, name, namespace, uid, generateName)."""
    try:
        out = json_patch(obj, ops)
    except (PatchError, ApiError) as exc:
        raise WebhookCallError(f"the patch does not apply: {exc}") from exc
    if not isinstance(out, dict) or not isinstance(out.get("metadata"), dict):
        raise WebhookCallError("the patch removed the object's metadata")
    for key in ("kind", "apiVersion"):
        if out.get(key) != obj.get(key):
            raise WebhookCallError(f"the patch may not change {key}")
    before, after = meta(obj), out["metadata"]
    for key in ("name", "namespace", "uid", "generateName"):
        if before.get(key) != after.get(key):
            raise WebhookCallError(f"the patch may not change metadata.{key}")
    return out


def denied(hook: Hook, status: Obj) -> ApiError:
    """The error a request fails with when `hook` denies it (the real server's wording and defaults)."""
    by = f'admission webhook "{hook.name}" denied the request'
    message = str(status.get("message") or "")
    reason = str(status.get("reason") or "")
    if message:
        text = f"{by}: {message}"
    elif reason:
        text = f"{by}: {reason}"
    else:
        text = f"{by} without explanation"
    code = status.get("code")
    code = code if isinstance(code, int) and not isinstance(code, bool) and code >= 400 else 400
    return ApiError(code, reason, text)


def failed(hook: Hook, why: str) -> ApiError:
    """The error a request fails with when a webhook of failurePolicy Fail could not be called or answered."""
    return ApiError(
        500, "InternalError", f'Internal error occurred: failed calling webhook "{hook.name}": {why}'
    )
