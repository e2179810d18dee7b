"""The leases bucket's key spaces: a shard's queue lease is `queue.<shard>`, the state service's leases are
`state.<name>`, so no shard name, whatever Kubernetes allows, reaches the state source's key; every key is
one NATS KV accepts, and two shard names never share one."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from services.state.sources.kube_source import LEASE_KEY
from shared.contracts import subjects as s

KV_KEY = re.compile(r"^[-/_=.a-zA-Z0-9]+$")
"""What JetStream KV accepts as a key (nats-py's `VALID_KEY_RE`), besides a leading or trailing dot."""

_LABEL = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
"""A Kubernetes object name such as a SchedulingShard's (RFC 1123 subdomain: at most 253 characters)."""

shard_names = st.from_regex(DNS_SUBDOMAIN, fullmatch=True).filter(lambda name: len(name) <= 253)


def valid_kv_key(key: str) -> bool:
    return bool(KV_KEY.match(key)) and not key.startswith(".") and not key.endswith(".")


def test_the_state_sources_lease_is_in_the_state_key_space() -> None:
    assert LEASE_KEY == s.state_lease_key("kube-source") == "state.kube-source"
    assert valid_kv_key(LEASE_KEY)


def test_the_shard_that_collided_before_has_its_own_key() -> None:
    assert s.lease_key("state-kube-source") == "queue.state-kube-source" != LEASE_KEY


@given(shard_names)
def test_no_shard_name_reaches_the_state_sources_lease(shard: str) -> None:
    key = s.lease_key(shard)
    assert key != LEASE_KEY
    assert key.startswith(s.SHARD_LEASE_PREFIX)
    assert valid_kv_key(key)


@given(shard_names, shard_names)
def test_two_shard_names_never_share_a_lease(a: str, b: str) -> None:
    assert (s.lease_key(a) == s.lease_key(b)) == (a == b)


@given(st.text(min_size=1, max_size=80))
def test_any_name_at_all_makes_a_valid_key_of_its_own_kind(name: str) -> None:
    # `kairos up --shards` and `--shard` take names that never went through Kubernetes.
    assert valid_kv_key(s.lease_key(name))
    assert valid_kv_key(s.state_lease_key(name))
    assert s.lease_key(name) != s.state_lease_key(name)
