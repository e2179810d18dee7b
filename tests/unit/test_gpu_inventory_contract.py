"""The GPU inventory's wire contract: its subjects fit their wildcards, it round-trips through msgpack, and a
bad payload is a MalformedMessage naming the subject."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.contracts import subjects as s
from shared.contracts.inventory import INVENTORIES, GpuDevice, GpuInventory, MigDevice
from shared.contracts.messages import HEARTBEATS, Heartbeat, encode
from shared.errors import MalformedMessage


def matches(subject: str, wildcard: str) -> bool:
    sub, wild = subject.split("."), wildcard.split(".")
    return len(sub) == len(wild) and all(w in ("*", part) for part, w in zip(sub, wild, strict=True))


@given(node=st.text(max_size=30))
def test_inventory_subjects_stay_inside_their_wildcards(node: str) -> None:
    assert matches(s.gpu_inventory(node), s.GPU_INVENTORY_WILDCARD)
    assert matches(s.gpu_inventory_request(node), s.GPU_INVENTORY_REQUEST_WILDCARD)


def test_a_requests_subject_is_not_an_inventory_subject() -> None:
    assert not matches(s.gpu_inventory_request("n1"), s.GPU_INVENTORY_WILDCARD)


def test_an_inventory_round_trips() -> None:
    inventory = GpuInventory(
        node="n1",
        time=1.5,
        period=30.0,
        devices=(
            GpuDevice(index=0, uuid="GPU-0", name="H100", memory_mib=81559, warnings=("w",)),
            GpuDevice(
                index=1,
                uuid="GPU-1",
                mig_enabled=True,
                mig_devices=(MigDevice(index=0, uuid="MIG-0", profile="1g.10gb", gpu_instance=9),),
                ecc_uncorrected_volatile=0,
            ),
        ),
        driver_version="550.54.15",
        cuda_driver_version="12.4",
    )
    assert INVENTORIES.decode("kairos.gpu.inventory.n1", encode(inventory)) == inventory


def test_an_inventory_without_nvml_round_trips_with_its_reason() -> None:
    inventory = GpuInventory(node="n1", time=1.0, period=30.0, error="no usable NVIDIA driver/NVML")
    assert INVENTORIES.decode("kairos.gpu.inventory.n1", encode(inventory)).error == inventory.error


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        b"\xff\x00garbage",
        msgspec.msgpack.encode({"kind": "nope"}),
        msgspec.msgpack.encode({"kind": "gpu-inventory", "node": "n1"}),
        msgspec.msgpack.encode(
            {"kind": "gpu-inventory", "node": "n1", "time": 1.0, "period": 30.0, "devices": [{}]}
        ),
        encode(Heartbeat(service="x", replica="y", ready=True)),
    ],
)
def test_a_bad_payload_is_a_malformed_message_naming_the_subject(payload: bytes) -> None:
    with pytest.raises(MalformedMessage, match=r"kairos\.gpu\.inventory\.n1"):
        INVENTORIES.decode("kairos.gpu.inventory.n1", payload)


def test_a_missing_field_is_named() -> None:
    payload = msgspec.msgpack.encode({"kind": "gpu-inventory", "node": "n1", "time": 1.0})
    with pytest.raises(MalformedMessage, match="period"):
        INVENTORIES.decode("kairos.gpu.inventory.n1", payload)


def test_an_unknown_contract_version_is_refused() -> None:
    future = msgspec.msgpack.encode(
        {"kind": "gpu-inventory", "v": 99, "node": "n1", "time": 1.0, "period": 3.0}
    )
    with pytest.raises(MalformedMessage, match="unknown contract version 99"):
        INVENTORIES.decode("kairos.gpu.inventory.n1", future)


def test_an_inventory_is_not_mistaken_for_another_internal_message() -> None:
    with pytest.raises(MalformedMessage):
        HEARTBEATS.decode("kairos.health.x.y", encode(GpuInventory(node="n1", time=1.0, period=3.0)))
