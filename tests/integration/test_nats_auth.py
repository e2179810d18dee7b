"""NATS authentication, per-service permissions and TLS against a real nats-server.

The server runs the configuration the local stack runs (`shared.security.nats_config.authorization` over
one password per identity): the permissions bite (placement's write to the ledger and its bind request
are refused by the server, the binder's succeed), a wrong or missing password is refused, and with TLS a
service connects through the CA it is given while a plain-text client is turned away.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import ipaddress
import json
import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout

from shared.bus.connection import Bus, NatsAuth, connect
from shared.contracts import subjects as s
from shared.contracts.messages import HEARTBEATS
from shared.errors import TemporaryError
from shared.security.nats_config import TlsFiles, authorization
from shared.security.permissions import ADMIN, BINDER, IDENTITIES, PLACEMENT, STATE
from tools.stack.nats_server import NatsServer, server_binary, start_nats_server

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PASSWORDS = {identity: f"{identity}-pw-7Qx" for identity in (*IDENTITIES, ADMIN)}


def as_(identity: str, **tls: str) -> NatsAuth:
    return NatsAuth(user=identity, password=PASSWORDS[identity], **tls)


@pytest.fixture
def auth_server(tmp_path: Path) -> Iterator[NatsServer]:
    server = start_nats_server(tmp_path / "nats-state", authorization=authorization(PASSWORDS))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
async def admin(auth_server: NatsServer) -> AsyncIterator[Bus]:
    # The admin declares the streams and buckets (as the state service does in a stack).
    bus = await connect(auth_server.url, "test-admin", auth=as_(ADMIN))
    try:
        yield bus
    finally:
        await bus.close()


async def as_service(server: NatsServer, identity: str) -> Bus:
    return await connect(server.url, f"test-{identity}", auth=as_(identity))


def violations(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "permissions violation" in r.getMessage()]


async def test_placement_cannot_write_the_ledger_and_the_binder_can(
    auth_server: NatsServer, admin: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kairos.bus")
    placement = await as_service(auth_server, PLACEMENT)
    binder = await as_service(auth_server, BINDER)
    try:
        key = s.ledger_node_key("node-1")
        # A short JetStream timeout: the refused write never gets its acknowledgement.
        ledger = await placement.nc.jetstream(timeout=1.0).key_value(s.LEDGER_BUCKET)
        with pytest.raises(NatsTimeout):
            await ledger.put(key, b"from placement")
        await asyncio.sleep(0.2)  # the server's -ERR arrives on its own
        assert any(f'publish to "$kv.{s.LEDGER_BUCKET}.node.node-1"' in v for v in violations(caplog))
        assert await admin.ledger.get(key) is None
        # Placement may still read the ledger (it stamps proposals with its revisions).
        assert await placement.ledger.get(key) is None

        revision = await binder.ledger.create(key, b"from binder")
        entry = await admin.ledger.get(key)
        assert entry is not None
        assert (entry.value, entry.revision) == (b"from binder", revision)
        assert not any(f'"$kv.{s.LEDGER_BUCKET}' in v and "binder" in v for v in violations(caplog))
    finally:
        await placement.close()
        await binder.close()


async def test_only_the_binder_s_bind_request_reaches_the_state_service(
    auth_server: NatsServer, admin: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kairos.bus")
    state = await as_service(auth_server, STATE)
    placement = await as_service(auth_server, PLACEMENT)
    binder = await as_service(auth_server, BINDER)
    heard: list[bytes] = []

    async def answer(msg: Msg) -> None:
        heard.append(msg.data)
        await msg.respond(b"bound")

    try:
        await state.nc.subscribe(s.CLUSTER_WILDCARD, cb=answer)
        await state.nc.flush()
        with pytest.raises(NatsTimeout):
            await placement.nc.request(s.cluster("bind"), b"placement binds", timeout=1.0)
        assert any(f'publish to "{s.cluster("bind")}"' in v for v in violations(caplog))
        reply = await binder.nc.request(s.cluster("bind"), b"binder binds", timeout=5.0)
        assert reply.data == b"bound"
        assert heard == [b"binder binds"]
    finally:
        for bus in (state, placement, binder):
            await bus.close()


async def test_an_identity_cannot_read_another_s_replies(
    auth_server: NatsServer, admin: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="kairos.bus")
    placement = await as_service(auth_server, PLACEMENT)
    try:
        await placement.nc.subscribe("_INBOX.binder.>")
        await placement.nc.flush()
        await asyncio.sleep(0.2)
        assert any('subscription to "_inbox.binder.>"' in v for v in violations(caplog))
    finally:
        await placement.close()


@pytest.mark.parametrize("password", ["wrong-password", None])
async def test_a_wrong_or_missing_password_is_refused(auth_server: NatsServer, password: str | None) -> None:
    auth = NatsAuth(user=PLACEMENT, password=password) if password else NatsAuth()
    with pytest.raises(TemporaryError, match="cannot connect to NATS") as refused:
        await connect(auth_server.url, "intruder", auth=auth, timeout=2.0)
    assert "wrong-password" not in str(refused.value)


async def test_errors_name_the_url_without_its_password(auth_server: NatsServer) -> None:
    # The server is up but refuses the user: the message keeps the user and hides the password.
    url = auth_server.url.replace("nats://", f"nats://{PLACEMENT}:not-it@")
    with pytest.raises(TemporaryError) as refused:
        await connect(url, "intruder", auth=NatsAuth(), timeout=2.0)
    assert f"nats://{PLACEMENT}:***@127.0.0.1:{auth_server.port}" in str(refused.value)
    assert "not-it" not in str(refused.value)


async def test_a_password_file_and_the_url_s_user_work_like_explicit_credentials(
    auth_server: NatsServer, admin: Bus, tmp_path: Path
) -> None:
    secret = tmp_path / "placement.password"
    secret.write_text(PASSWORDS[PLACEMENT] + "\n")
    from_file = await connect(
        auth_server.url, "from-file", auth=NatsAuth(user=PLACEMENT, password_file=str(secret))
    )
    await from_file.close()
    url = auth_server.url.replace("nats://", f"nats://{BINDER}:{PASSWORDS[BINDER]}@")
    in_url = await connect(url, "in-url", auth=NatsAuth())
    try:
        # The URL's user decides the inbox prefix, which the binder's permissions let it read.
        assert await in_url.ledger.create(s.ledger_node_key("n"), b"x") > 0
    finally:
        await in_url.close()


# --- TLS ----------------------------------------------------------------------------------------------------
def _write_pem(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


def throwaway_pki(folder: Path) -> TlsFiles:
    """A CA made for this test and a server certificate for 127.0.0.1 / localhost signed by it."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kairos test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "nats")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    folder.mkdir(parents=True, exist_ok=True)
    return TlsFiles(
        cert=_write_pem(folder / "server.pem", cert.public_bytes(serialization.Encoding.PEM)),
        key=_write_pem(
            folder / "server-key.pem",
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        ),
        ca=_write_pem(folder / "ca.pem", ca.public_bytes(serialization.Encoding.PEM)),
    )


@pytest.fixture
def tls_server(tmp_path: Path) -> Iterator[tuple[NatsServer, TlsFiles]]:
    files = throwaway_pki(tmp_path / "pki")
    server = start_nats_server(
        tmp_path / "nats-state", authorization=authorization(PASSWORDS), tls_files=files
    )
    try:
        yield server, files
    finally:
        server.stop()


async def test_a_service_connects_over_tls_with_the_ca_from_its_environment(
    tls_server: tuple[NatsServer, TlsFiles], tmp_path: Path
) -> None:
    server, files = tls_server
    assert server.url.startswith("tls://")
    secret = tmp_path / "state.password"
    secret.write_text(PASSWORDS[STATE])
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("KAIROS_")},
        "KAIROS_NATS_URL": server.url,
        "KAIROS_NATS_USER": STATE,
        "KAIROS_NATS_PASSWORD_FILE": str(secret),
        "KAIROS_NATS_TLS_CA": files.ca,
    }
    admin = await connect(server.url, "tls-admin", auth=as_(ADMIN, tls_ca=files.ca))
    ready = asyncio.Event()

    async def on_beat(msg: Msg) -> None:
        if HEARTBEATS.decode(msg.subject, msg.data).ready:
            ready.set()

    await admin.nc.subscribe(s.health("state", "state-tls"), cb=on_beat)
    process = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "services.state", "--replica", "state-tls", "--set", "source=sim"),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        try:
            await asyncio.wait_for(ready.wait(), 60)
        except TimeoutError:
            process.terminate()
            _, err = await process.communicate()
            pytest.fail(f"the state service did not report ready over TLS: {err.decode()}")
        # Its password is nowhere on its command line (what `ps` shows everyone).
        cmdline = await asyncio.to_thread(Path(f"/proc/{process.pid}/cmdline").read_text)
        assert PASSWORDS[STATE] not in cmdline
    finally:
        if process.returncode is None:
            process.terminate()
        await asyncio.wait_for(process.communicate(), 20)
        await admin.close()


def test_a_plain_text_client_is_refused(tls_server: tuple[NatsServer, TlsFiles]) -> None:
    server, _ = tls_server
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        info = sock.recv(4096)
        assert b'"tls_required":true' in info
        sock.sendall(b'CONNECT {"user":"admin","pass":"admin-pw-7Qx","verbose":false}\r\nPING\r\n')
        answer = b""
        while chunk := sock.recv(4096):
            answer += chunk
    # The server expected a TLS handshake, got plain text and hung up without a PONG.
    assert b"PONG" not in answer


async def test_a_client_that_does_not_trust_the_ca_is_refused(
    tls_server: tuple[NatsServer, TlsFiles],
) -> None:
    server, _ = tls_server
    with pytest.raises(TemporaryError, match="certificate verify failed"):
        await connect(server.url, "untrusting", auth=as_(ADMIN), timeout=2.0)


def tls_component_flags() -> list[str]:
    """The TLS flags deploy/base's NATS container adds to its command (TLS is the base's default)."""
    docs = yaml.safe_load_all((ROOT / "deploy" / "base" / "nats.yaml").read_text())
    nats = next(d for d in docs if d and d["kind"] == "StatefulSet")
    command: list[str] = nats["spec"]["template"]["spec"]["containers"][0]["command"]
    return [flag for flag in command if flag.startswith("--tls")]


async def _tls_handshakes(url: str, ca: str) -> None:
    trusting = Client()
    await trusting.connect(url, connect_timeout=5, allow_reconnect=False, **NatsAuth(tls_ca=ca).options(url))
    await trusting.close()
    with pytest.raises(TemporaryError, match="certificate verify failed"):
        await connect(url, "untrusting", auth=NatsAuth(), timeout=2.0)


def test_the_tls_component_s_server_flags_serve_tls(tmp_path: Path) -> None:
    """What deploy/base makes the NATS pods run, here with the throwaway CA's files where the Secret goes."""
    files = throwaway_pki(tmp_path / "pki")
    mounted = tmp_path / "etc-nats-tls"
    mounted.mkdir()
    for source, name in ((files.cert, "tls.crt"), (files.key, "tls.key"), (files.ca, "ca.crt")):
        (mounted / name).write_bytes(Path(source).read_bytes())
    flags = [f.replace("/etc/nats-tls", str(mounted)) for f in tls_component_flags()]
    assert flags[0] == "--tls"
    ports = tmp_path / "ports"
    ports.mkdir()
    process = subprocess.Popen(
        [server_binary(), "-a", "127.0.0.1", "-p", "-1", "--ports_file_dir", str(ports), *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        port = 0
        while not port:
            assert time.monotonic() < deadline, "nats-server with the component's flags did not start"
            for found in ports.glob("*.ports"):
                with contextlib.suppress(ValueError, KeyError, IndexError):
                    port = int(json.loads(found.read_text())["nats"][0].rsplit(":", 1)[1])
            time.sleep(0.05)
        asyncio.run(_tls_handshakes(f"tls://127.0.0.1:{port}", files.ca))
    finally:
        process.terminate()
        process.wait(10)
