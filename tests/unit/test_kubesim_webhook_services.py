"""Where kubesim calls a webhook given by `clientConfig.service` (tools.kubesim.admission.service_endpoints
and endpoint_url): the ready endpoints of the Service's EndpointSlices at the slice port named as the
Service's port, as the API server's endpoint resolver reads them; none to call says why."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tools.kubesim.admission import (
    Endpoint,
    WebhookCallError,
    endpoint_url,
    service_endpoints,
    validate_configuration,
)
from tools.kubesim.errors import ApiError

Obj = dict[str, Any]
REF: Obj = {"namespace": "kai-scheduler", "name": "hooks", "port": 443, "path": "/mutate-pods"}


def service(*ports: Obj, kind: str | None = None) -> Obj:
    spec: Obj = {"ports": list(ports) or [{"name": "https", "port": 443, "targetPort": 9443}]}
    if kind:
        spec["type"] = kind
    return {"metadata": {"name": "hooks", "namespace": "kai-scheduler"}, "spec": spec}


def endpoint(address: str, ready: bool | None = True) -> Obj:
    out: Obj = {"addresses": [address]}
    if ready is not None:
        out["conditions"] = {"ready": ready}
    return out


def endpoint_slice(
    name: str, *endpoints: Obj, port: int = 9443, port_name: str = "https", of: str = "hooks"
) -> Obj:
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/service-name": of}},
        "addressType": "IPv4",
        "ports": [{"name": port_name, "port": port, "protocol": "TCP"}],
        "endpoints": list(endpoints),
    }


@pytest.mark.parametrize(
    ("svc", "slices", "expected"),
    [
        pytest.param(None, [], 'service "kai-scheduler/hooks" not found', id="no Service"),
        pytest.param(
            service(), [], 'no endpoints available for service "kai-scheduler/hooks"', id="no slice"
        ),
        pytest.param(
            service(),
            [endpoint_slice("hooks-a")],
            'no endpoints available for service "kai-scheduler/hooks"',
            id="a slice without endpoints",
        ),
        pytest.param(
            service(),
            [endpoint_slice("hooks-a", endpoint("127.0.0.1", ready=False))],
            'no endpoints available for service "kai-scheduler/hooks"',
            id="endpoints not ready",
        ),
        pytest.param(
            service(),
            [endpoint_slice("other-a", endpoint("127.0.0.1"), of="other")],
            'no endpoints available for service "kai-scheduler/hooks"',
            id="another Service's slice",
        ),
        pytest.param(
            service(),
            [endpoint_slice("hooks-a", endpoint("127.0.0.1"), port_name="metrics")],
            'no endpoints available for service "kai-scheduler/hooks"',
            id="the slice lacks the Service port's name",
        ),
        pytest.param(
            service({"name": "https", "port": 8443}),
            [endpoint_slice("hooks-a", endpoint("127.0.0.1"))],
            'no service port 443 found for service "kai-scheduler/hooks"',
            id="the Service lacks the port",
        ),
        pytest.param(
            service(kind="ExternalName"),
            [endpoint_slice("hooks-a", endpoint("127.0.0.1"))],
            'service "kai-scheduler/hooks": unsupported service type "ExternalName"',
            id="an ExternalName Service",
        ),
    ],
)
def test_a_service_with_nothing_ready_to_call_fails_the_call_saying_why(
    svc: Obj | None, slices: list[Obj], expected: str
) -> None:
    with pytest.raises(WebhookCallError) as caught:
        service_endpoints(REF, svc, slices)
    assert str(caught.value) == expected


@pytest.mark.parametrize(
    ("slices", "expected"),
    [
        pytest.param(
            [endpoint_slice("hooks-a", endpoint("127.0.0.1"), endpoint("127.0.0.2", ready=False))],
            [Endpoint("127.0.0.1", 9443)],
            id="only the ready ones",
        ),
        pytest.param(
            [endpoint_slice("hooks-a", endpoint("127.0.0.1", ready=None))],
            [Endpoint("127.0.0.1", 9443)],
            id="an unknown readiness counts as ready",
        ),
        pytest.param(
            [
                endpoint_slice("hooks-b", endpoint("127.0.0.1"), port=2),
                endpoint_slice("hooks-a", endpoint("127.0.0.1"), endpoint("127.0.0.1"), port=1),
            ],
            [Endpoint("127.0.0.1", 1), Endpoint("127.0.0.1", 1), Endpoint("127.0.0.1", 2)],
            id="every slice, by name, each at its own port",
        ),
    ],
)
def test_the_ready_endpoints_of_the_services_slices_are_called(
    slices: list[Obj], expected: list[Endpoint]
) -> None:
    assert service_endpoints(REF, service(), slices) == expected


def test_an_unnamed_service_port_matches_the_unnamed_slice_port_and_443_is_the_default() -> None:
    svc = service({"port": 443, "targetPort": 9000})
    slices = [endpoint_slice("hooks-a", endpoint("127.0.0.1"), port=9000, port_name="")]
    reference = {"namespace": "kai-scheduler", "name": "hooks"}
    assert service_endpoints(reference, svc, slices) == [Endpoint("127.0.0.1", 9000)]


@pytest.mark.parametrize(
    ("host", "path", "url"),
    [
        ("127.0.0.1", "/mutate-pods", "http://127.0.0.1:9443/mutate-pods"),
        ("::1", "/mutate-pods", "http://[::1]:9443/mutate-pods"),
        ("10.0.0.7", "/mutate-pods", "https://10.0.0.7:9443/mutate-pods"),
        ("127.0.0.1", None, "http://127.0.0.1:9443/"),
    ],
)
def test_loopback_endpoints_are_called_over_http_and_others_over_https(
    host: str, path: str | None, url: str
) -> None:
    reference = {**REF, "path": path}
    assert endpoint_url(reference, Endpoint(host, 9443)) == url


@pytest.mark.parametrize(
    ("reference", "field"),
    [
        ({"name": "hooks"}, "webhooks[0].clientConfig.service.namespace"),
        ({"namespace": "ns"}, "webhooks[0].clientConfig.service.name"),
        ({"namespace": "ns", "name": "hooks", "path": "mutate"}, "webhooks[0].clientConfig.service.path"),
        ({"namespace": "ns", "name": "hooks", "port": 0}, "webhooks[0].clientConfig.service.port"),
        ({"namespace": "ns", "name": "hooks", "port": "443"}, "webhooks[0].clientConfig.service.port"),
    ],
)
def test_a_service_reference_missing_or_bad_in_a_field_is_refused_naming_it(
    reference: Obj, field: str
) -> None:
    hook = {
        "name": "h.kairos.test",
        "clientConfig": {"service": reference},
        "sideEffects": "None",
        "admissionReviewVersions": ["v1"],
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
        "timeoutSeconds": 5,
        "namespaceSelector": {},
        "objectSelector": {},
    }
    config = {"metadata": {"name": "c"}, "webhooks": [hook]}
    with pytest.raises(ApiError) as caught:
        validate_configuration("admissionregistration.k8s.io/mutatingwebhookconfigurations", config)
    assert caught.value.code == 422
    assert field in caught.value.message


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=12,
)


@given(
    ports=_JSON,
    endpoints=_JSON,
    slice_ports=_JSON,
)
def test_hostile_services_and_slices_resolve_or_fail_the_call_and_nothing_else(
    ports: Any, endpoints: Any, slice_ports: Any
) -> None:
    svc = {"metadata": {"name": "hooks"}, "spec": {"ports": ports}}
    bad = {
        "metadata": {"name": "hooks-a", "labels": {"kubernetes.io/service-name": "hooks"}},
        "ports": slice_ports,
        "endpoints": endpoints,
    }
    try:
        found = service_endpoints(REF, svc, [bad])
    except WebhookCallError:
        return
    assert all(isinstance(e.host, str) and isinstance(e.port, int) for e in found)
