"""`kairos up`, `kairos down`, `kairos serve`: the local stack from the command line.

`up` starts nats-server and the four services (a simulated GPU cluster in the state service), prints one
line `ready` when every replica reports healthy, and stops everything on Ctrl-C or SIGTERM. With
`--detach` it runs the same supervisor in the background and returns once it is ready; `down` stops it.
`serve NAME` runs one service in this process (what the stack starts, and what a Deployment runs).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared.cli.stack import parse_replicas, start_stack, stop_recorded
from shared.errors import ConfigError

DEFAULT_STATE_DIR = Path(".kairos")


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = commands.add_parser("up", help="start nats-server and the services (the local stack)")
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    up.add_argument("--replicas", help="replica counts, e.g. placement=2,binder=2")
    up.add_argument("--cluster", type=Path, help="cluster file for the simulated cluster (default: a demo)")
    up.add_argument("--port", type=int, default=-1, help="NATS port (default: a free one)")
    up.add_argument("--detach", action="store_true", help="run in the background; stop with kairos down")
    up.add_argument("--batch", default="all", help="podgroups per work item: all (one per cycle) or N")
    up.set_defaults(handler=cmd_up)
    down = commands.add_parser("down", help="stop a stack started with kairos up --detach")
    down.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    down.set_defaults(handler=cmd_down)
    serve = commands.add_parser("serve", help="run one service in this process")
    serve.add_argument("service", choices=("state", "queue", "placement", "binder"))
    serve.add_argument("args", nargs=argparse.REMAINDER, help="the service's own flags")
    serve.set_defaults(handler=cmd_serve)


def _options(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    state: dict[str, str] = {"source": "sim"}
    if args.cluster is not None:
        if not args.cluster.is_file():
            raise ConfigError(f"--cluster: no such file {args.cluster}")
        state["cluster"] = str(args.cluster.resolve())
    else:
        state["demo"] = "true"
    return {"state": state, "queue": {"batch": str(args.batch)}}


def cmd_up(args: argparse.Namespace) -> int:
    replicas = parse_replicas(args.replicas)
    state_dir: Path = args.state_dir
    if args.detach:
        return _detach(args, state_dir)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stack = start_stack(state_dir, replicas, _options(args), port=args.port)
    (state_dir / "ready").write_text(stack.url + "\n")
    print("ready", flush=True)
    try:
        while not stop.is_set():
            dead = [n for n, p in stack.processes.items() if p.poll() is not None]
            if dead:
                print(f"kairos: service {dead[0]} exited; stopping", file=sys.stderr)
                return 1
            stop.wait(0.5)
    finally:
        stack.stop()
        (state_dir / "ready").unlink(missing_ok=True)
    return 0


def _detach(args: argparse.Namespace, state_dir: Path) -> int:
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / "ready").unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "shared.cli.main",
        "up",
        "--state-dir",
        str(state_dir),
        "--port",
        str(args.port),
    ]
    argv += ["--batch", str(args.batch)]
    if args.replicas:
        argv += ["--replicas", args.replicas]
    if args.cluster is not None:
        argv += ["--cluster", str(args.cluster)]
    with (state_dir / "up.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (state_dir / "supervisor.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if (state_dir / "ready").exists():
            print("ready", flush=True)
            return 0
        if proc.poll() is not None:
            print(f"kairos: the stack failed to start; see {state_dir / 'up.log'}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    proc.terminate()
    print(f"kairos: the stack was not ready within 90 s; see {state_dir / 'up.log'}", file=sys.stderr)
    return 1


def cmd_down(args: argparse.Namespace) -> int:
    if not stop_recorded(args.state_dir):
        print(f"nothing running under {args.state_dir}")
    else:
        print("stopped")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # Services are separate packages the shared library must not import: run the module as a program.
    # Exec, not a child process: as a container's PID 1 the service itself must get SIGTERM to drain (a
    # parent PID 1 without a handler would ignore the signal and the pod would be killed mid-work).
    argv = [sys.executable, "-m", f"services.{args.service}", *args.args]
    os.execv(sys.executable, argv)
