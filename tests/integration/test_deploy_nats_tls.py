"""The NATS TLS Secret as deploy/README.md has an operator make it, against a real nats-server.

TLS to NATS is on by default in deploy/ (issue 27, finding 12), with the Secret `kairos-nats-tls` created
at install. The README's commands run here as written (OpenSSL, and a stand-in `kubectl` that records the
Secret it is asked to create); the certificate they make names what the pods connect to and chains to the
CA the pods mount; nats-server serves it, a client that trusts the CA and asks for `nats` connects, so does
an operator's `kairos` CLI through `kubectl port-forward` (127.0.0.1, the CA in `KAIROS_NATS_TLS_CA`), and
a plain-text client or one that does not trust the CA is refused.
"""

from __future__ import annotations

import ipaddress
import re
import ssl
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest
from cryptography import x509
from cryptography.x509.verification import PolicyBuilder, Store

from shared.bus.connection import NatsAuth, connect
from shared.security.nats_config import TlsFiles
from tests.unit.test_deploy_manifests import DEPLOY, base, container, find
from tools.stack.nats_server import NatsServer, start_nats_server

pytestmark = pytest.mark.integration

NAMESPACE = "kai-scheduler"
SECRET = "kairos-nats-tls"


def readme_block() -> str:
    """The README's shell block that makes the Secret."""
    blocks = re.findall(r"```sh\n(.*?)```", (DEPLOY / "README.md").read_text(), flags=re.DOTALL)
    found = [b for b in blocks if f"create secret generic {SECRET}" in b and "openssl req -x509" in b]
    assert len(found) == 1, "deploy/README.md: one block makes the NATS TLS Secret"
    return found[0]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder where the README's block ran: ca.crt, tls.crt, tls.key and kubectl.args."""
    folder = tmp_path_factory.mktemp("nats-tls")
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    kubectl = bin_dir / "kubectl"
    kubectl.write_text('#!/bin/sh\nprintf "%s\\n" "$@" > "$PWD/kubectl.args"\n')
    kubectl.chmod(kubectl.stat().st_mode | stat.S_IXUSR)
    result = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", readme_block()],
        cwd=folder,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(folder)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return folder


def test_the_readme_creates_the_secret_the_deployment_mounts(made: Path) -> None:
    args = (made / "kubectl.args").read_text().split()
    assert args == [
        "-n",
        NAMESPACE,
        "create",
        "secret",
        "generic",
        SECRET,
        "--from-file=tls.crt",
        "--from-file=tls.key",
        "--from-file=ca.crt",
    ]
    nats_pod = find(base(), "StatefulSet", "nats")
    volumes = {v["name"]: v for v in nats_pod["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == SECRET


@pytest.mark.parametrize("name", ["nats", f"nats.{NAMESPACE}.svc", f"nats.{NAMESPACE}.svc.cluster.local"])
def test_the_certificate_names_the_service_and_chains_to_the_ca(made: Path, name: str) -> None:
    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((made / "tls.crt").read_bytes())
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(x509.DNSName(name))
    chain = verifier.verify(leaf, [])
    assert chain[-1] == ca


def test_the_certificate_names_the_loopback_address_a_port_forward_listens_on(made: Path) -> None:
    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((made / "tls.crt").read_bytes())
    loopback = x509.IPAddress(ipaddress.ip_address("127.0.0.1"))
    PolicyBuilder().store(Store([ca])).build_server_verifier(loopback).verify(leaf, [])


def test_the_certificate_does_not_name_anything_else(made: Path) -> None:
    ca = x509.load_pem_x509_certificate((made / "ca.crt").read_bytes())
    leaf = x509.load_pem_x509_certificate((made / "tls.crt").read_bytes())
    verifier = PolicyBuilder().store(Store([ca])).build_server_verifier(x509.DNSName("nats.example.com"))
    with pytest.raises(x509.verification.VerificationError):
        verifier.verify(leaf, [])


@pytest.fixture
def tls_server(made: Path, tmp_path: Path) -> Iterator[NatsServer]:
    # The same files the StatefulSet's flags name (--tlscert, --tlskey, --tlscacert), TLS required.
    flags = container(find(base(), "StatefulSet", "nats"))["command"][3:]
    files = dict(flag.removeprefix("--").split("=", 1) for flag in flags if "=" in flag)
    assert {k: Path(v).name for k, v in files.items()} == {
        "tlscert": "tls.crt",
        "tlskey": "tls.key",
        "tlscacert": "ca.crt",
    }
    server = start_nats_server(
        tmp_path / "nats-state",
        tls_files=TlsFiles(cert=str(made / "tls.crt"), key=str(made / "tls.key"), ca=str(made / "ca.crt")),
    )
    try:
        yield server
    finally:
        server.stop()


async def test_a_client_that_trusts_the_ca_connects_to_nats_by_its_service_name(
    made: Path, tls_server: NatsServer
) -> None:
    context = ssl.create_default_context(cafile=str(made / "ca.crt"))
    client = await nats.connect(
        tls_server.url, tls=context, tls_hostname="nats", allow_reconnect=False, connect_timeout=5
    )
    try:
        await client.flush()
        assert client.is_connected
    finally:
        await client.close()


async def test_a_plain_text_client_and_one_without_the_ca_are_refused(
    made: Path, tls_server: NatsServer
) -> None:
    plain = tls_server.url.replace("tls://", "nats://")
    with pytest.raises(Exception):  # noqa: B017, PT011 -- nats-py raises what the failed handshake gives it
        await nats.connect(plain, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)
    stranger = ssl.create_default_context()  # the system's CAs, not this one
    with pytest.raises(Exception):  # noqa: B017, PT011
        await nats.connect(
            tls_server.url,
            tls=stranger,
            tls_hostname="nats",
            allow_reconnect=False,
            max_reconnect_attempts=0,
            connect_timeout=2,
        )


async def test_an_operator_connects_through_a_port_forward_with_the_ca(
    made: Path, tls_server: NatsServer
) -> None:
    # As deploy/README.md has `kairos status` do: tls://127.0.0.1:<forwarded port>, KAIROS_NATS_TLS_CA.
    auth = NatsAuth.from_env({"KAIROS_NATS_TLS_CA": str(made / "ca.crt")})
    bus = await connect(tls_server.url, "operator-cli", auth=auth, timeout=5.0)
    try:
        assert bus.nc.is_connected
    finally:
        await bus.close()
