"""What `shared.bus.operations` counts a message sent to NATS as: its family and operation, both bounded."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from shared.bus.operations import OperationsCollector, as_counters, counting, operation_of, parse_counters

CAS = {"Nats-Expected-Last-Subject-Sequence": "12"}


@pytest.mark.parametrize(
    ("subject", "reply", "headers", "payload", "expected"),
    [
        ("$KV.kairos_state.pod.ns.p", "_INBOX.1", None, b"x", ("kv.kairos_state.pod", "put")),
        ("$KV.kairos_ledger.node.n1", "_INBOX.1", CAS, b"x", ("kv.kairos_ledger.node", "update")),
        (
            "$KV.kairos_state.pod.ns.p",
            "_INBOX.1",
            {"KV-Operation": "DEL"},
            b"",
            ("kv.kairos_state.pod", "delete"),
        ),
        (
            "$KV.kairos_state.pod.ns.p",
            "_INBOX.1",
            {"KV-Operation": "PURGE"},
            b"",
            ("kv.kairos_state.pod", "purge"),
        ),
        (
            "$JS.API.DIRECT.GET.KV_kairos_ledger.$KV.kairos_ledger.node.n1",
            "_INBOX.1",
            None,
            b"",
            ("kv.kairos_ledger.node", "get"),
        ),
        ("$JS.API.STREAM.MSG.GET.KV_kairos_state", "_INBOX.1", None, b"{}", ("kv.kairos_state", "get")),
        (
            "$JS.API.STREAM.MSG.GET.KV_kairos_state",
            "_INBOX.1",
            None,
            b'{"last_by_subj": "$KV.kairos_state.podgroup.ns.g"}',
            ("kv.kairos_state.podgroup", "get"),
        ),
        (
            "$JS.API.CONSUMER.MSG.NEXT.KAIROS_WORK.placement",
            "_INBOX.1",
            None,
            b"",
            ("jetstream.api", "CONSUMER.MSG"),
        ),
        ("$JS.API.STREAM.INFO.KV_kairos_state", "_INBOX.1", None, b"", ("jetstream.api", "STREAM.INFO")),
        ("$JS.ACK.KAIROS_WORK.placement.1.2.3.4.5", "", None, b"+ACK", ("ack.KAIROS_WORK", "ack")),
        ("$JS.ACK.KAIROS_WORK.placement.1.2.3.4.5", "", None, b"", ("ack.KAIROS_WORK", "ack")),
        (
            "$JS.ACK.KAIROS_WORK.placement.1.2.3.4.5",
            "",
            None,
            b'-NAK {"delay":1}',
            ("ack.KAIROS_WORK", "nak"),
        ),
        ("$JS.ACK.KAIROS_PROPOSALS.b.1.2.3.4.5", "", None, b"+TERM", ("ack.KAIROS_PROPOSALS", "term")),
        ("kairos.work.default", "_INBOX.1", None, b"x", ("kairos.work", "request")),
        ("kairos.stamps.default", "", None, b"x", ("kairos.stamps", "publish")),
        ("kairos.events.pod-bound.ns.p", "_INBOX.1", None, b"x", ("kairos.events.pod-bound", "request")),
        ("_INBOX.abc.def", "", None, b"x", ("reply", "publish")),
        ("$KV.kairos_state.Pod-With-Caps.x", "_INBOX.1", None, b"x", ("kv.kairos_state.other", "put")),
        ("$KV.kairos_state", "_INBOX.1", None, b"x", ("kv.kairos_state.other", "put")),
    ],
)
def test_a_message_is_counted_by_what_it_is_for(
    subject: str, reply: str, headers: dict[str, str] | None, payload: bytes, expected: tuple[str, str]
) -> None:
    assert operation_of(subject, reply, headers, payload) == expected


@given(st.text(max_size=80), st.text(max_size=20), st.binary(max_size=12))
def test_any_subject_gets_a_family_and_an_operation_without_a_key_in_them(
    subject: str, reply: str, payload: bytes
) -> None:
    family, op = operation_of(subject, reply, None, payload)
    assert isinstance(family, str)
    assert op
    if subject.startswith("$KV."):
        kind = family.rpartition(".")[2]
        assert kind == "other" or (kind.isalpha() and kind.islower() and len(kind) <= 16)


def test_the_counts_go_through_a_heartbeat_and_back_unchanged() -> None:
    counts = {
        ("kv.kairos_state", "put"): 3,
        ("kairos.events.pod-bound", "request"): 2,
        ("reply", "publish"): 1,
    }
    flat = as_counters(counts)
    assert flat["bus:kv.kairos_state:put"] == 3
    assert parse_counters({**flat, "handled": 9}) == counts


async def test_a_counted_client_counts_each_message_before_sending_it() -> None:
    sent: list[tuple[str, bytes, str, dict[str, str] | None]] = []

    async def publish(
        subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        sent.append((subject, payload, reply, headers))

    tally: Counter[tuple[str, str]] = Counter()
    counted = counting(publish, tally)
    await counted("$KV.kairos_state.pod.a", b"v", "_INBOX.1", None)
    await counted("$KV.kairos_state.pod.b", b"v", "_INBOX.2", None)
    await counted("kairos.stamps.default", b"s")
    assert tally == Counter({("kv.kairos_state.pod", "put"): 2, ("kairos.stamps", "publish"): 1})
    assert [m[0] for m in sent] == [
        "$KV.kairos_state.pod.a",
        "$KV.kairos_state.pod.b",
        "kairos.stamps.default",
    ]


def test_the_counts_are_a_prometheus_counter_labelled_by_family_and_operation() -> None:
    registry = CollectorRegistry()
    registry.register(OperationsCollector(Counter({("kv.kairos_state", "put"): 4})))
    value = registry.get_sample_value(
        "kairos_bus_operations_total", {"family": "kv.kairos_state", "operation": "put"}
    )
    assert value == 4
