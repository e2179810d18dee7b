"""The local stack: nats-server plus the four services as separate processes, started and stopped together.

Used by `kairos up` / `kairos down` (the embedded default of `make run`) and by the conformance runner's
`--via-bus` mode. Readiness comes from the services' own heartbeats: `start_stack` returns once every
expected replica has reported ready. Everything lives under a state directory: `nats.url`, `stack.json`
(the pids), `logs/`, and JetStream's data.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from shared.bus.health import wait_ready
from shared.bus.nats_server import NatsServer, pid_alive, start_nats_server
from shared.errors import ConfigError

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


@dataclass
class Stack:
    state_dir: Path
    nats: NatsServer
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.nats.url

    def first_exit(self) -> str | None:
        """A service that has exited (with where to read why), or None."""
        for name, proc in self.processes.items():
            if proc.poll() is not None:
                return f"service {name} exited with {proc.returncode}; see {self.state_dir / 'logs' / (name + '.log')}"
        return None

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM every service (they drain and finish in-flight work), then the server; nothing left."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.processes.values():
            remaining = max(0.1, deadline - time.monotonic())
            try:
                proc.wait(remaining)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.nats.stop()
        with contextlib.suppress(FileNotFoundError):
            (self.state_dir / "stack.json").unlink()


def _service_args(service: str, replica: str, options: dict[str, str]) -> list[str]:
    args = [sys.executable, "-m", f"services.{service}", "--replica", replica]
    for key, value in options.items():
        args += ["--set", f"{key}={value}"]
    return args


def start_stack(
    state_dir: Path,
    replicas: dict[str, int] | None = None,
    options: dict[str, dict[str, str]] | None = None,
    timeout: float = 60.0,
    port: int = -1,
) -> Stack:
    """Start nats-server and the services; return once all replicas report ready (or raise)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    counts = replicas or dict(DEFAULT_REPLICAS)
    server = start_nats_server(state_dir, port=port)
    (state_dir / "nats.url").write_text(server.url + "\n")
    logs = state_dir / "logs"
    logs.mkdir(exist_ok=True)
    stack = Stack(state_dir, server)
    env = {**os.environ, "KAIROS_NATS_URL": server.url}
    try:
        for service in SERVICES:
            for i in range(counts.get(service, 1)):
                replica = f"{service}-{i}"
                opts = dict((options or {}).get(service, {}))
                if service == "state" and i > 0:
                    opts["source"] = "none"
                with (logs / f"{replica}.log").open("ab") as log:
                    stack.processes[replica] = subprocess.Popen(
                        _service_args(service, replica, opts),
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=env,
                        start_new_session=True,
                    )
        _write_pids(stack)
        asyncio.run(wait_ready(server.url, set(stack.processes), timeout, stack.first_exit))
    except BaseException:
        stack.stop()
        raise
    return stack


def _write_pids(stack: Stack) -> None:
    data = {
        "nats": stack.nats.process.pid,
        "url": stack.url,
        "services": {k: p.pid for k, p in stack.processes.items()},
    }
    (stack.state_dir / "stack.json").write_text(json.dumps(data, indent=2))


def stop_recorded(state_dir: Path, timeout: float = 15.0) -> bool:
    """`kairos down`: stop what `stack.json` (or the supervisor pid) records. False when nothing ran."""
    supervisor = state_dir / "supervisor.pid"
    stopped = False
    if supervisor.exists():
        pid = int(supervisor.read_text().strip() or 0)
        if pid and pid_alive(pid):
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            stopped = True
        supervisor.unlink(missing_ok=True)
    record = state_dir / "stack.json"
    if record.exists():
        data = json.loads(record.read_text())
        pids = [*data.get("services", {}).values(), data.get("nats")]
        for pid in pids:
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGTERM)
                stopped = True
        deadline = time.monotonic() + timeout
        for pid in pids:
            while pid and pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if pid and pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
        record.unlink(missing_ok=True)
    return stopped
