"""The local stack: nats-server plus the four services as separate processes, started and stopped together.

Used by `kairos up` (the embedded default of `make run`; `kairos down` is `tools.stack.down`), the
conformance runner's `--via-bus` mode and the end-to-end tests. Readiness comes from the services' own
heartbeats: `start_stack` returns once every expected replica has reported ready. Everything lives under a
state directory (owner-only, 0700, when the stack made it): `nats.url`, `stack.json` (the pids), `logs/`,
JetStream's data, and `kubeconfig`.

With `nats_cluster=N` NATS is N servers in one JetStream cluster (`NatsCluster`), Kairos's streams and
buckets are declared at N replicas (up to 5) before the services start, and `KAIROS_NATS_URL` lists every
server.

NATS requires authentication by default: each start generates one random password per identity of
`shared.security.permissions` into `auth/<identity>.password` (0600), the server's configuration grants
each identity its subjects, and every service connects as itself (`KAIROS_NATS_USER` and
`KAIROS_NATS_PASSWORD_FILE` in its environment, never on its command line). `nats.url` (0600) names the
`operator` identity the `kairos` CLI uses; `Stack.url`, for the in-process callers (tests, benchmarks,
the conformance runner), names `admin`.

Where the cluster lives is a `ClusterChoice`: the simulated Kubernetes API server (`tools.kubesim`,
started here, its kubeconfig written to `DIR/kubeconfig`; KAI's default queues are created in it), a
real cluster's kubeconfig, or — with `ClusterChoice.memory()`, or no choice at all — the state
service's in-memory cluster, which needs no Kubernetes API (the conformance runner uses it).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from shared.bus.connection import ENV_NAMES, ENV_PASSWORD_FILE, ENV_REPLICAS, ENV_USER, connect
from shared.bus.health import wait_ready
from shared.contracts.subjects import DEFAULT_SHARD as DEFAULT_SHARD_NAME
from shared.errors import ConfigError, KairosError
from shared.security.nats_config import authorization
from shared.security.permissions import ADMIN, IDENTITIES, OPERATOR
from tools.stack.nats_server import (
    NatsCluster,
    NatsServer,
    start_nats_cluster,
    start_nats_server,
    write_private,
)

REPO = Path(__file__).resolve().parents[2]
CRDS = REPO / "deploy" / "crds"
DEFAULT_QUEUES = REPO / "examples" / "kai" / "queues.yaml"
DEFAULT_SHARD_FILE = REPO / "deploy" / "shards" / "default-shard.yaml"
"""KAI's default SchedulingShard, which a fresh install has (the services serve the shard of that name)."""
KUBESIM = "kubesim"
NATS_SERVER = "nats-server"
"""The single nats-server's name in supervision's records (a cluster's servers are `nats-<i>`)."""

SERVICES = ("state", "queue", "placement", "binder")
DEFAULT_REPLICAS = {"state": 1, "queue": 1, "placement": 1, "binder": 1}


def parse_replicas(text: str | None) -> dict[str, int]:
    """`placement=2,binder=2` -> replica counts (others 1); errors name the field."""
    counts = dict(DEFAULT_REPLICAS)
    if not text:
        return counts
    for item in text.split(","):
        name, sep, value = item.strip().partition("=")
        if not sep or name not in SERVICES:
            raise ConfigError(
                f"--replicas: expected SERVICE=N with SERVICE in {', '.join(SERVICES)}, got {item!r}"
            )
        try:
            n = int(value)
        except ValueError as exc:
            raise ConfigError(f"--replicas: {name}: {value!r} is not a number") from exc
        if n < 1:
            raise ConfigError(f"--replicas: {name}: must be >= 1, got {n}")
        counts[name] = n
    return counts


STOP_REASON = "asked to stop while starting"


class StartStoppedError(KairosError):
    """`start_stack` was asked to stop (its `stop` event) before the stack was ready; what it had started is
    stopped."""


@dataclass(frozen=True)
class ClusterChoice:
    """Where the stack's cluster lives (see the module docstring)."""

    kind: str = "kubesim"
    """`kubesim`, `kubeconfig` or `memory`."""
    kubeconfig: Path | None = None
    cluster_file: Path | None = None
    """For kubesim: the nodes of this cluster file (default: `nodes` nodes of `gpus_per_node` GPUs)."""
    nodes: int = 8
    gpus_per_node: int = 8
    run_delay: float = 0.5

    @classmethod
    def memory(cls) -> ClusterChoice:
        return cls(kind="memory")


@dataclass
class Stack:
    state_dir: Path
    nats: NatsServer | NatsCluster
    """The one nats-server (the default), or the cluster of them (`start_stack(nats_cluster=N)`)."""
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    """Each service replica's command line, so that `restart` starts it again as it was."""
    env: dict[str, str] = field(default_factory=dict)
    passwords: dict[str, str] = field(default_factory=dict, repr=False)
    """Identity -> this start's NATS password (empty: the server takes anyone)."""
    services: dict[str, str] = field(default_factory=dict)
    """Each service replica's service (`queue-pool-a-0` -> `queue`): its NATS identity."""
    webhook_ports: list[int] = field(default_factory=list)
    """The state replicas' admission webhook ports kubesim calls (registered again after its restart)."""

    def restart(self, name: str) -> None:
        """Start replica `name` again with its command line (after it died or was killed); its log goes on."""
        with (self.state_dir / "logs" / f"{name}.log").open("ab") as log:
            self.processes[name] = subprocess.Popen(
                self.commands[name],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_service_env(self.env, self, self.services[name]),
                start_new_session=True,
            )
        _write_pids(self)

    def restart_kubesim(self, timeout: float = 30.0) -> None:
        """Start the simulated API server again on the port it had (the services' kubeconfig stays right),
        and give it KAI's default queues and shard and the webhooks again: its objects lived in its memory
        and are gone, as a cluster whose etcd was wiped."""
        kubeconfig = self.state_dir / "kubeconfig"
        kubeconfig.unlink(missing_ok=True)
        _launch_kubesim(self, self.commands[KUBESIM], timeout)
        _bootstrap(kubeconfig)
        if self.webhook_ports:
            _register_webhook(kubeconfig, self.webhook_ports)
        _write_pids(self)

    @property
    def nats_nodes(self) -> dict[str, NatsServer]:
        """Each nats-server by the name supervision and logs use: `nats-server` alone, `nats-<i>` in a
        cluster."""
        if isinstance(self.nats, NatsCluster):
            return {f"nats-{i}": node for i, node in enumerate(self.nats.nodes)}
        return {NATS_SERVER: self.nats}

    def restart_nats(self, *, kill: bool = False, node: int = 0) -> None:
        """Stop nats-server (SIGTERM, or SIGKILL with `kill`: no chance to flush or say goodbye) and start it
        again on the same port with the same JetStream store. In a cluster this is node `node` alone; the
        others keep serving."""
        if isinstance(self.nats, NatsCluster):
            self.nats.restart_node(node, kill=kill)
            _write_pids(self)
            return
        if kill:
            self.nats.kill()
        else:
            self.nats.stop()
        self.nats = start_nats_server(
            self.state_dir, port=self.nats.port, authorization=_authorization(self.passwords)
        )
        _write_pids(self)

    @property
    def url(self) -> str:
        """Where in-process callers connect: as `admin` when the server requires authentication. It holds
        a password: pass it through `redact_url` before printing it."""
        return self.url_as(ADMIN)

    def url_as(self, identity: str) -> str:
        """The server's URL with an identity's credentials (the plain URL without authentication)."""
        if not self.passwords:
            return self.nats.url
        return with_credentials(self.nats.url, identity, self.passwords[identity])

    @property
    def kubeconfig(self) -> Path | None:
        path = self.state_dir / "kubeconfig"
        return path if path.exists() else None

    def first_exit(self) -> str | None:
        """A service that has exited (with where to read why), or None."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                return f"service {name} exited with {proc.returncode}; see {self.state_dir / 'logs' / (name + '.log')}"
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every service (they drain and finish in-flight work), then the simulated API server (the
        services' in-flight calls need it), then the server; nothing left."""
        deadline = time.monotonic() + timeout
        services = [p for name, p in self.processes.items() if name != KUBESIM]
        cluster = [p for name, p in self.processes.items() if name == KUBESIM]
        for group in (services, cluster):
            for proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in group:
                remaining = max(0.1, deadline - time.monotonic())
                try:
                    proc.wait(remaining)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self.nats.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "stack.json").unlink()


def otlp_env(url: str) -> dict[str, str]:
    """The environment that makes every service export all its traces to the OTLP/HTTP collector at `url`
    (`kairos up --otlp URL`); errors name the flag."""
    if not url.startswith(("http://", "https://")):
        raise ConfigError(
            f"--otlp: expected the collector's http(s) URL (e.g. http://localhost:4318), got {url!r}"
        )
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": url.rstrip("/"), "OTEL_TRACES_SAMPLER": "always_on"}


def with_credentials(url: str, user: str, password: str) -> str:
    """`nats://host:port` -> `nats://user:password@host:port` (the passwords we generate are URL-safe);
    each URL of a comma-separated list (a cluster's) gets them."""
    if "," in url:
        return ",".join(with_credentials(one.strip(), user, password) for one in url.split(","))
    scheme, sep, rest = url.partition("://")
    return f"{scheme}{sep}{user}:{password}@{rest}" if sep else f"{user}:{password}@{url}"


def _generate_passwords(state_dir: Path) -> dict[str, str]:
    """A fresh random password per identity, each in `auth/<identity>.password` (0600)."""
    folder = state_dir / "auth"
    folder.mkdir(mode=0o700, exist_ok=True)
    folder.chmod(0o700)
    passwords = {identity: secrets.token_urlsafe(24) for identity in (*IDENTITIES, ADMIN)}
    for identity, password in passwords.items():
        write_private(folder / f"{identity}.password", password + "\n")
    return passwords


def _authorization(passwords: Mapping[str, str]) -> str | None:
    return authorization(passwords) if passwords else None


def _service_env(base: Mapping[str, str], stack: Stack, service: str) -> dict[str, str]:
    """A service's environment: the shared one, without any NATS credentials inherited from ours, plus its
    own identity (user name and the file holding its password)."""
    env = {k: v for k, v in base.items() if k not in ENV_NAMES}
    if stack.passwords:
        env[ENV_USER] = service
        env[ENV_PASSWORD_FILE] = str(stack.state_dir / "auth" / f"{service}.password")
    return env


def _service_args(service: str, replica: str, options: dict[str, str], restriction: str = "") -> list[str]:
    """A replica's command line; `restriction`: the shards it may serve (`--shard`; empty: every shard)."""
    args = [sys.executable, "-m", f"services.{service}", "--replica", replica]
    if restriction and service != "state":
        args += ["--shard", restriction]
    for key, value in options.items():
        args += ["--set", f"{key}={value}"]
    return args


def start_stack(
    state_dir: Path,
    replicas: dict[str, int] | None = None,
    options: dict[str, dict[str, str]] | None = None,
    timeout: float = 60.0,
    port: int = -1,
    cluster: ClusterChoice | None = None,
    env: Mapping[str, str] | None = None,
    auth: bool = True,
    shards: Sequence[str] = (),
    nats_cluster: int = 1,
    stop: threading.Event | None = None,
) -> Stack:
    """Start the cluster (when simulated), nats-server and the services; return once all replicas report
    ready (or raise). Without `cluster` the state service keeps an in-memory cluster. `env` is added to
    every process's environment (`otlp_env`: export traces). `auth=False` runs NATS open to anyone
    (loopback only), as before authentication existed. Without `shards`, every queue, placement and binder
    replica serves every shard: `default` and each SchedulingShard as it is created, changed or deleted
    (`shared.bus.shard_spread`). `shards` (besides the default shard) is the older layout, kept as a
    restriction: each named shard gets queue, placement and binder replicas of its own
    (`queue-<shard>-0`, ...), as many as the default set's, restricted to it (`--shard`), and the default set
    is restricted to the default shard; the one state service serves them all. `nats_cluster` > 1 runs that many nats-servers as one JetStream
    cluster (`tools.stack.nats_server.NatsCluster`), and Kairos's streams and buckets get one replica per
    server, up to JetStream's 5 (`cluster_replicas`); every service is given every server's URL. `stop`
    set while starting (`kairos up` got SIGTERM or Ctrl-C, from `kairos down`) stops what was started and
    raises `StartStoppedError`."""
    extra = [shard for shard in dict.fromkeys(shards) if shard != DEFAULT_SHARD_NAME]
    for shard in extra:
        if not shard or not all(c.isalnum() or c == "-" for c in shard):
            raise ConfigError(f"--shards: {shard!r} is not a shard name (letters, digits and '-')")
    fresh = not state_dir.exists()
    state_dir.mkdir(parents=True, exist_ok=True)
    if fresh or (state_dir / "nats").is_dir():
        # Passwords, the operator's URL and the logs live here: the owner's alone. A directory that was not
        # made for a stack (`--state-dir /tmp` by mistake) keeps its mode; the secret files are 0600 anyway.
        state_dir.chmod(0o700)
    cluster = cluster or ClusterChoice.memory()
    counts = replicas or dict(DEFAULT_REPLICAS)
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    (state_dir / "kubeconfig").unlink(missing_ok=True)
    passwords = _generate_passwords(state_dir) if auth else {}
    server: NatsServer | NatsCluster
    extra_env: dict[str, str] = {}
    if nats_cluster > 1:
        server = start_nats_cluster(state_dir, nats_cluster, authorization=_authorization(passwords))
        extra_env[ENV_REPLICAS] = str(cluster_replicas(nats_cluster))
    else:
        server = start_nats_server(state_dir, port=port, authorization=_authorization(passwords))
    stack = Stack(state_dir, server, passwords=passwords)

    def stopping() -> str | None:
        return STOP_REASON if stop is not None and stop.is_set() else None

    def check_stop() -> None:
        if reason := stopping():
            raise StartStoppedError(reason)

    write_private(state_dir / "nats.url", stack.url_as(OPERATOR) + "\n")
    env = {**os.environ, **(env or {}), "KAIROS_NATS_URL": server.url, **extra_env}
    stack.env = env
    options = {name: dict(opts) for name, opts in (options or {}).items()}
    webhook_ports: list[int] = []
    kubeconfig: Path | None = None
    try:
        if isinstance(server, NatsCluster):
            # Declared here, before any service connects, at the cluster's replica count: JetStream answers
            # once the servers have elected a meta leader, and a reader that declares (the admin) keeps
            # what exists.
            asyncio.run(_declare_replicated(stack.url, cluster_replicas(nats_cluster), timeout))
        check_stop()
        if cluster.kind != "memory":
            kubeconfig = _start_cluster(stack, cluster, timeout)
            options.setdefault("state", {}).update(source="kube", kubeconfig=str(kubeconfig))
            options.setdefault("binder", {}).update(cluster="kube", kubeconfig=str(kubeconfig))
            if cluster.kind == KUBESIM and "webhook_port" not in options["state"]:
                # kubesim calls the state replicas' admission webhooks through a Service whose endpoints
                # are these ports on loopback (`tools.stack.webhook_service`).
                webhook_ports = [free_port() for _ in range(counts.get("state", 1))]
        placed = [(service, DEFAULT_SHARD_NAME) for service in SERVICES]
        placed += [(service, shard) for shard in extra for service in SERVICES if service != "state"]
        for service, shard in placed:
            check_stop()
            for i in range(counts.get(service, 1)):
                replica = f"{service}-{i}" if shard == DEFAULT_SHARD_NAME else f"{service}-{shard}-{i}"
                opts = dict(options.get(service, {}))
                if service == "state" and i > 0 and not _partitioned(opts, env):
                    # One replica owns the source; the others serve snapshots (and their webhook), unless
                    # the state service divides its work into partitions, where every replica mirrors.
                    opts["source"] = "none"
                if service == "state" and webhook_ports:
                    opts["webhook_port"] = str(webhook_ports[i])
                stack.services[replica] = service
                restriction = shard if extra else ""
                stack.commands[replica] = _service_args(service, replica, opts, restriction)
                with (logs / f"{replica}.log").open("ab") as log:
                    stack.processes[replica] = subprocess.Popen(
                        stack.commands[replica],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=_service_env(env, stack, service),
                        start_new_session=True,
                    )
        _write_pids(stack)
        services = {name for name in stack.processes if name != KUBESIM}
        asyncio.run(wait_ready(stack.url, services, timeout, lambda: stopping() or stack.first_exit()))
        check_stop()
        if webhook_ports and kubeconfig is not None:
            _register_webhook(kubeconfig, webhook_ports)
            stack.webhook_ports = webhook_ports
    except BaseException as exc:
        stack.stop()
        if stopping() and not isinstance(exc, StartStoppedError):
            raise StartStoppedError(STOP_REASON) from exc
        raise
    return stack


def _partitioned(state_options: dict[str, str], env: dict[str, str]) -> bool:
    """Whether the state replicas divide their work into partitions (`--set partitions=N`, or
    KAIROS_PARTITIONS; a value that does not read is left for the service to refuse, naming it)."""
    text = state_options.get("partitions", env.get("KAIROS_PARTITIONS", "0"))
    try:
        return int(text) > 0
    except ValueError:
        return True


def check_nats_cluster(servers: int) -> int:
    """`--nats-cluster N`, returned when it is 1 (one server) or at least 3: a cluster of 2 stops on either's
    death (JetStream needs a majority), so it is refused with a `ConfigError` naming the flag."""
    if servers != 1 and servers < 3:
        raise ConfigError(f"--nats-cluster: 1 (one server) or at least 3 servers, got {servers}")
    return servers


def cluster_replicas(servers: int) -> int:
    """Replicas of each stream and bucket on a cluster of `servers` nats-servers (JetStream allows 5)."""
    return min(servers, 5)


async def _declare_replicated(url: str, replicas: int, timeout: float) -> None:
    bus = await connect(url, "kairos-up", timeout=timeout, replicas=replicas, declared_timeout=timeout)
    await bus.close()


def _start_cluster(stack: Stack, cluster: ClusterChoice, timeout: float) -> Path:
    """Start the simulated API server (unless a real cluster is given) and create KAI's default queues;
    returns the kubeconfig the services use."""
    if cluster.kind == "kubeconfig":
        if cluster.kubeconfig is None or not cluster.kubeconfig.is_file():
            raise ConfigError(f"--kubeconfig: no such file {cluster.kubeconfig}")
        kubeconfig = cluster.kubeconfig.resolve()
    else:
        kubeconfig = stack.state_dir / "kubeconfig"
        # A fixed port, so that a restarted simulator is where the services' kubeconfig says.
        argv = [sys.executable, "-m", "tools.kubesim", "--port", str(free_port())]
        argv += [
            "--kubeconfig-out",
            str(kubeconfig),
            "--crds",
            str(CRDS),
            "--run-delay",
            str(cluster.run_delay),
        ]
        if cluster.cluster_file is not None:
            argv += ["--cluster", str(cluster.cluster_file.resolve())]
        else:
            argv += ["--nodes", str(cluster.nodes), "--gpus-per-node", str(cluster.gpus_per_node)]
        stack.commands[KUBESIM] = argv
        _launch_kubesim(stack, argv, timeout)
    _bootstrap(kubeconfig)
    return kubeconfig


def _launch_kubesim(stack: Stack, argv: list[str], timeout: float) -> None:
    """Start the simulated API server; return once it has written its kubeconfig."""
    kubeconfig = stack.state_dir / "kubeconfig"
    log_path = stack.state_dir / "logs" / f"{KUBESIM}.log"
    with log_path.open("ab") as log:
        stack.processes[KUBESIM] = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, env=stack.env, start_new_session=True
        )
    deadline = time.monotonic() + timeout
    while not kubeconfig.exists():
        if stack.processes[KUBESIM].poll() is not None or time.monotonic() > deadline:
            raise ConfigError(f"the simulated API server did not start; see {log_path}")
        time.sleep(0.05)


def _bootstrap(kubeconfig: Path) -> None:
    """KAI's default queues and shard, as a fresh install has them."""
    # Imported here: kubernetes-asyncio is slow to import and only the Kubernetes modes need it.
    from tools.stack.bootstrap import ensure_objects

    asyncio.run(ensure_objects(str(kubeconfig), DEFAULT_QUEUES, DEFAULT_SHARD_FILE))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _register_webhook(kubeconfig: Path, ports: list[int]) -> None:
    """Point kubesim's pod admission (the `kairos.io/after` and quota gates) and its Queue admission at the
    state replicas' webhooks on `ports`, behind one Service as on a cluster: each review goes to one
    replica (`tools.stack.webhook_service`)."""
    from tools.stack import webhook_service

    asyncio.run(webhook_service.register(str(kubeconfig), ports))


def _write_pids(stack: Stack) -> None:
    pids = [node.process.pid for node in stack.nats_nodes.values()]
    data = {
        "nats": pids[0],
        "nats_nodes": pids,
        "url": stack.nats.url,
        "services": {k: p.pid for k, p in stack.processes.items()},
    }
    (stack.state_dir / "stack.json").write_text(json.dumps(data, indent=2))
