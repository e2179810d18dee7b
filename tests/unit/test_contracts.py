"""The wire contract: subjects fit their wildcards, payloads round-trip, bad payloads are named errors,
and docs/events.md is what the event structs generate."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.contracts import messages as m
from shared.contracts import subjects as s
from shared.contracts.schema import DOC, render
from shared.errors import MalformedMessage
from shared.model import Namespace, Node


def matches(subject: str, wildcard: str) -> bool:
    sub, wild = subject.split("."), wildcard.split(".")
    for i, w in enumerate(wild):
        if w == ">":
            return len(sub) > i
        if i >= len(sub) or (w != "*" and w != sub[i]):
            return False
    return len(sub) == len(wild)


@given(name=st.text(min_size=0, max_size=20), other=st.text(min_size=0, max_size=20))
def test_every_builder_stays_inside_its_wildcard(name: str, other: str) -> None:
    assert matches(s.work(name), s.WORK_WILDCARD)
    assert matches(s.proposals(name), s.PROPOSAL_WILDCARD)
    assert matches(s.outcomes(name), s.OUTCOMES_WILDCARD)
    assert matches(s.cluster(name), s.CLUSTER_WILDCARD)
    assert matches(s.admin(name, other), s.ADMIN_WILDCARD)
    assert matches(s.health(name, other), s.HEALTH_WILDCARD)
    assert matches(s.event(name, other), s.EVENTS_WILDCARD)


@given(name=st.text(max_size=30))
def test_kv_keys_use_only_characters_jetstream_accepts(name: str) -> None:
    for key in (
        s.node_key(name),
        s.pod_key(name, name),
        s.podgroup_key(name, name),
        s.namespace_key(name),
        s.ledger_claim_key(name),
    ):
        assert all(ch.isalnum() or ch in "_-/=." for ch in key), key
        assert ".." not in key


def test_records_round_trip() -> None:
    record = m.NodeRecord(node=Node(name="a", cpu_millis=1000, memory_bytes=1e9, gpus=2))
    assert m.STATE_RECORDS.decode("k", m.encode(record)) == record
    labelled = m.NamespaceRecord(namespace=Namespace("team-a", {"team": "a"}))
    assert m.STATE_RECORDS.decode("k", m.encode(labelled)) == labelled


@pytest.mark.parametrize(
    "codec",
    [
        m.STATE_RECORDS,
        m.LEDGER_RECORDS,
        m.WORK,
        m.PROPOSALS,
        m.OUTCOMES,
        m.CLUSTER_REQUESTS,
        m.CYCLE_REQUESTS,
    ],
)
@pytest.mark.parametrize(
    "payload", [b"", b"\xff\x00garbage", msgspec.msgpack.encode({"kind": "nope"}), b"{}"]
)
def test_garbage_is_a_malformed_message_naming_the_subject(codec: m.Codec[object], payload: bytes) -> None:
    with pytest.raises(MalformedMessage, match=r"kairos\.test"):
        codec.decode("kairos.test", payload)


def test_an_unknown_contract_version_is_refused() -> None:
    future = msgspec.msgpack.encode({"kind": "cycle-request", "v": 99})
    with pytest.raises(MalformedMessage, match="unknown contract version 99"):
        m.CYCLE_REQUESTS.decode("kairos.admin.default.cycle", future)


def test_invalid_model_values_inside_a_payload_are_malformed() -> None:
    bad = msgspec.msgpack.encode({"kind": "node", "node": {"name": "n", "cpu_millis": -1, "memory_bytes": 1}})
    with pytest.raises(MalformedMessage, match="cpu_millis"):
        m.STATE_RECORDS.decode("kairos.state", bad)


def test_events_doc_is_generated_from_the_structs() -> None:
    assert DOC.read_text() == render(), "run `python -m shared.contracts.schema` to regenerate docs/events.md"
