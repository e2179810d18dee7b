"""The protobuf bodies kubectl's `create <kind>` generators send, decoded into JSON-like objects."""

from __future__ import annotations

import pytest

from tools.kubesim.errors import ApiError
from tools.kubesim.protobuf import MAGIC, decode_object


def varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def field(number: int, value: int | str | bytes) -> bytes:
    if isinstance(value, int):
        return varint(number << 3) + varint(value)
    data = value.encode() if isinstance(value, str) else value
    return varint(number << 3 | 2) + varint(len(data)) + data


def envelope(api_version: str, kind: str, raw: bytes) -> bytes:
    type_meta = field(1, api_version) + field(2, kind)
    return MAGIC + field(1, type_meta) + field(2, raw) + field(3, "") + field(4, "")


def test_a_namespace_decodes_with_empty_fields_left_out() -> None:
    metadata = field(1, "team") + field(2, "") + field(7, 0) + field(8, b"")
    body = envelope("v1", "Namespace", field(1, metadata) + field(2, b"") + field(3, field(1, "")))
    assert decode_object(body) == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team"}}


def test_maps_repeated_fields_and_quantities_decode_to_their_json_forms() -> None:
    labels = field(11, field(1, "app") + field(2, "web"))
    resources = field(2, field(1, "cpu") + field(2, field(1, "500m")))
    container = field(1, "main") + field(2, "nginx") + field(3, "sleep") + field(3, "1") + field(8, resources)
    pod_spec = field(2, container) + field(19, "kai-scheduler")
    template = field(1, labels) + field(2, pod_spec)
    spec = field(1, 0) + field(3, template)
    body = envelope("apps/v1", "Deployment", field(1, field(1, "web") + labels) + field(2, spec))
    decoded = decode_object(body)
    assert decoded["metadata"] == {"name": "web", "labels": {"app": "web"}}
    assert decoded["spec"]["replicas"] == 0, "a pointer field keeps its zero"
    assert decoded["spec"]["template"]["spec"] == {
        "containers": [
            {
                "name": "main",
                "image": "nginx",
                "command": ["sleep", "1"],
                "resources": {"requests": {"cpu": "500m"}},
            }
        ],
        "schedulerName": "kai-scheduler",
    }


def test_secret_data_becomes_base64() -> None:
    body = envelope(
        "v1",
        "Secret",
        field(1, field(1, "s")) + field(2, field(1, "k") + field(2, b"v")) + field(3, "Opaque"),
    )
    assert decode_object(body)["data"] == {"k": "dg=="}


def test_a_kind_outside_the_generators_is_415() -> None:
    with pytest.raises(ApiError) as caught:
        decode_object(envelope("v1", "Pod", field(1, field(1, "p"))))
    assert caught.value.code == 415


def test_an_unknown_field_with_a_value_is_415_rather_than_dropped() -> None:
    with pytest.raises(ApiError) as caught:
        decode_object(envelope("v1", "ConfigMap", field(1, field(1, "c")) + field(9, "surprise")))
    assert caught.value.code == 415
    assert "field 9 of ConfigMap" in caught.value.message


def test_a_body_without_the_magic_is_415() -> None:
    with pytest.raises(ApiError) as caught:
        decode_object(b'{"kind": "Namespace"}')
    assert caught.value.code == 415
