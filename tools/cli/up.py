"""`kairos up`, `kairos down`, `kairos serve`: the local stack from the command line.

`up` starts the cluster, nats-server and the four services, prints one line `ready` when every replica
reports healthy, keeps them running as a kubelet would (a replica, kubesim or nats-server that exits is
started again after a back-off, 1 s doubling to 30 s, `tools.stack.supervision`; the others keep
running), and stops everything on Ctrl-C or SIGTERM. The cluster is, by default, the simulated
Kubernetes API server (`tools.kubesim`, with `--cluster FILE`'s nodes or `--nodes` x
`--gpus-per-node`), its kubeconfig written to `DIR/kubeconfig` so that kubectl works against it at once;
`--kubeconfig FILE` uses a real cluster instead; `--memory` keeps the cluster inside the state service
(no Kubernetes API; `kairos submit` feeds it). `--nats-cluster 3` runs three nats-servers as one
JetStream cluster with every stream and bucket at 3 replicas, as deploy/ does; each is supervised alone. `--otlp URL` sends every service's traces to an OTLP/HTTP
collector (docs/tracing.md). With `--detach` it runs the same supervisor in the
background and returns once it is ready. Either way the supervisor's pid is in `DIR/supervisor.pid`, and
`down` stops the stack through it (`tools.stack.down`): the supervisor stops every process and restarts
none (one still starting gives up); `down` says what it could not stop, naming the process and why, and
then exits 1.
`serve NAME` runs one service in this process (what the stack starts, and what a Deployment runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from shared.errors import ConfigError
from tools.stack.down import SUPERVISOR_PID, Stopped, stop_recorded
from tools.stack.supervision import Supervisor
from tools.stack.supervisor import (
    ClusterChoice,
    Stack,
    StartStoppedError,
    check_nats_cluster,
    otlp_env,
    parse_replicas,
    start_stack,
)

DEFAULT_STATE_DIR = Path(".kairos")


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    up = commands.add_parser("up", help="start nats-server and the services (the local stack)")
    up.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    up.add_argument("--replicas", help="replica counts, e.g. placement=2,binder=2")
    up.add_argument(
        "--shards",
        default="",
        help="not needed: every replica serves every SchedulingShard as it comes. Kept as a restriction: "
        "each named shard (e.g. pool-a,pool-b) gets queue, placement and binder replicas of its own, serving "
        "only it, and the default replicas then serve only the default shard",
    )
    up.add_argument("--cluster", type=Path, help="cluster file: the simulated cluster's nodes")
    up.add_argument(
        "--kubeconfig", type=Path, help="run against this real cluster instead of a simulated one"
    )
    up.add_argument(
        "--memory", action="store_true", help="keep the cluster in the state service (no Kubernetes API)"
    )
    up.add_argument("--nodes", type=int, default=8, help="simulated nodes when no --cluster (default 8)")
    up.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per simulated node (default 8)")
    up.add_argument(
        "--run-delay", type=float, default=0.5, help="seconds a bound pod takes to turn Running (default 0.5)"
    )
    up.add_argument("--port", type=int, default=-1, help="NATS port (default: a free one)")
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=1,
        metavar="N",
        help="run N nats-servers as one JetStream cluster, streams and buckets at N replicas (default 1)",
    )
    up.add_argument("--detach", action="store_true", help="run in the background; stop with kairos down")
    up.add_argument("--batch", default="all", help="podgroups per work item: all (one per cycle) or N")
    up.add_argument(
        "--otlp",
        metavar="URL",
        help="export every service's traces to this OTLP/HTTP collector (Jaeger: :4318)",
    )
    up.set_defaults(handler=cmd_up)
    down = commands.add_parser("down", help="stop the stack kairos up runs (detached or in the foreground)")
    down.add_argument("--state-dir", type=Path, default=DEFAULT_STATE_DIR)
    down.set_defaults(handler=cmd_down)
    serve = commands.add_parser("serve", help="run one service in this process")
    serve.add_argument("service", choices=("state", "queue", "placement", "binder", "gpu_agent"))
    serve.add_argument("args", nargs=argparse.REMAINDER, help="the service's own flags")
    serve.set_defaults(handler=cmd_serve)


def _options(args: argparse.Namespace) -> dict[str, dict[str, str]]:
    # Live GPU telemetry steers fractional pods in kairos up (the conformance runner keeps KAI's scores).
    options: dict[str, dict[str, str]] = {"queue": {"batch": str(args.batch), "gpu_usage_scoring": "true"}}
    if args.cluster is not None and not args.cluster.is_file():
        raise ConfigError(f"--cluster: no such file {args.cluster}")
    if args.memory:
        state = {"source": "sim"}
        if args.cluster is not None:
            state["cluster"] = str(args.cluster.resolve())
        else:
            state["demo"] = "true"
        options["state"] = state
    return options


def _cluster(args: argparse.Namespace) -> ClusterChoice:
    if args.memory and args.kubeconfig is not None:
        raise ConfigError("--memory and --kubeconfig: give one, not both")
    if args.memory:
        return ClusterChoice.memory()
    if args.kubeconfig is not None:
        return ClusterChoice(kind="kubeconfig", kubeconfig=args.kubeconfig)
    if args.nodes < 1 or args.gpus_per_node < 0:
        raise ConfigError("--nodes must be >= 1 and --gpus-per-node >= 0")
    return ClusterChoice(
        kind="kubesim",
        cluster_file=args.cluster,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        run_delay=args.run_delay,
    )


def cmd_up(args: argparse.Namespace) -> int:
    replicas = parse_replicas(args.replicas)
    state_dir: Path = args.state_dir
    (
        _options(args),
        _cluster(args),
        _shards(args.shards),
        _nats_cluster(args),
    )  # flag errors now, before a detached supervisor hides them in its log
    if args.otlp:
        otlp_env(args.otlp)
    if args.detach:
        return _detach(args, state_dir)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    options, cluster = _options(args), _cluster(args)
    env = otlp_env(args.otlp) if args.otlp else None
    if _shards(args.shards):
        print(SHARDS_NOTE, file=sys.stderr, flush=True)
    _make_state_dir(state_dir)
    # Before anything starts: `kairos down` finds this supervisor (and stops it) from the first moment.
    pid_file = state_dir / SUPERVISOR_PID
    pid_file.write_text(f"{os.getpid()}\n")
    try:
        stack = start_stack(
            state_dir,
            replicas,
            options,
            port=args.port,
            cluster=cluster,
            env=env,
            shards=_shards(args.shards),
            nats_cluster=_nats_cluster(args),
            stop=stop,
        )
    except StartStoppedError:
        print("kairos: stopped before the stack was ready", file=sys.stderr, flush=True)
        _forget_pid(pid_file)
        return 0
    except BaseException:
        _forget_pid(pid_file)
        raise
    try:
        _supervise(stack, stop)
    finally:
        stack.stop()
        (state_dir / "ready").unlink(missing_ok=True)
        _forget_pid(pid_file)
    return 0


def _supervise(stack: Stack, stop: threading.Event) -> None:
    # The URL without credentials: the file is world-readable and only its existence means "ready".
    (stack.state_dir / "ready").write_text(stack.nats.url + "\n")
    print("ready", flush=True)
    _note_missing_kubectl()
    supervisor = Supervisor(
        stack, time.monotonic(), say=lambda line: print(f"kairos: {line}", file=sys.stderr, flush=True)
    )
    # Only Ctrl-C, SIGTERM or `kairos down` stops the stack: a process that exits is started again.
    while not stop.is_set():
        supervisor.poll(time.time())
        stop.wait(0.5)


def _note_missing_kubectl() -> None:
    """One line when kubectl is not on PATH: the stack runs without it, the walk-through does not."""
    if shutil.which("kubectl") is None:
        print(KUBECTL_MISSING, file=sys.stderr, flush=True)


def _make_state_dir(state_dir: Path) -> None:
    """The state directory, made owner-only when it is new (it will hold the passwords and the logs)."""
    if not state_dir.exists():
        state_dir.mkdir(mode=0o700, parents=True)


def _forget_pid(pid_file: Path) -> None:
    """Remove the supervisor's pid file if it still names this process."""
    try:
        if pid_file.read_text().strip() == str(os.getpid()):
            pid_file.unlink()
    except OSError:
        return


def _nats_cluster(args: argparse.Namespace) -> int:
    """`--nats-cluster N` (`check_nats_cluster`), which takes its own ports."""
    size = check_nats_cluster(args.nats_cluster)
    if size > 1 and args.port != -1:
        raise ConfigError("--nats-cluster with --port: a cluster's servers take free ports; drop --port")
    return size


KUBECTL_MISSING = (
    "kairos: kubectl not found on PATH: the stack runs without it, but the walk-through needs it; install it "
    "(https://kubernetes.io/docs/tasks/tools/), then export KUBECONFIG=<state dir>/kubeconfig"
)
SHARDS_NOTE = (
    "kairos: --shards is not needed any more (every replica serves every SchedulingShard as it is created, "
    "changed or deleted); as given, each named shard gets replicas of its own serving only it, and the default "
    "replicas serve only the default shard"
)


def _shards(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _detach(args: argparse.Namespace, state_dir: Path) -> int:
    _make_state_dir(state_dir)
    (state_dir / "ready").unlink(missing_ok=True)
    argv = [
        sys.executable,
        "-m",
        "tools.cli.main",
        "up",
        "--state-dir",
        str(state_dir),
        "--port",
        str(args.port),
    ]
    argv += ["--batch", str(args.batch), "--nats-cluster", str(args.nats_cluster)]
    if args.otlp:
        argv += ["--otlp", args.otlp]
    if args.replicas:
        argv += ["--replicas", args.replicas]
    if args.shards:
        argv += ["--shards", args.shards]
    if args.cluster is not None:
        argv += ["--cluster", str(args.cluster.resolve())]
    if args.kubeconfig is not None:
        argv += ["--kubeconfig", str(args.kubeconfig.resolve())]
    if args.memory:
        argv.append("--memory")
    argv += ["--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node)]
    argv += ["--run-delay", str(args.run_delay)]
    with (state_dir / "up.log").open("ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    (state_dir / SUPERVISOR_PID).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if (state_dir / "ready").exists():
            print("ready", flush=True)
            _note_missing_kubectl()
            return 0
        if proc.poll() is not None:
            print(f"kairos: the stack failed to start; see {state_dir / 'up.log'}", file=sys.stderr)
            return 1
        time.sleep(0.2)
    proc.terminate()
    print(f"kairos: the stack was not ready within 90 s; see {state_dir / 'up.log'}", file=sys.stderr)
    return 1


def cmd_down(args: argparse.Namespace) -> int:
    return report_down(stop_recorded(args.state_dir), args.state_dir)


def report_down(result: Stopped, state_dir: Path) -> int:
    """Print what `kairos down` did; 1 when something is still running (each named, with why), else 0."""
    for line in result.forced:
        print(f"kairos: {line}", file=sys.stderr)
    if result.left:
        for line in result.left:
            print(f"kairos: not stopped: {line}", file=sys.stderr)
        return 1
    print("stopped" if result.found else f"nothing running under {state_dir}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    # The service runs as its own program (`python -m services.NAME`), as the local stack starts it.
    # Exec, not a child process: as a container's PID 1 the service itself must get SIGTERM to drain (a
    # parent PID 1 without a handler would ignore the signal and the pod would be killed mid-work).
    argv = [sys.executable, "-m", f"services.{args.service}", *args.args]
    os.execv(sys.executable, argv)
