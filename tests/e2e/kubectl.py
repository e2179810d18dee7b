"""The real kubectl against a stack's cluster, for the end-to-end tests.

`kubectl(stack, *args, stdin=...)` runs kubectl with the stack's kubeconfig (the simulated API server
`start_stack` runs) and returns its stdout; a non-zero exit fails the test with kubectl's stderr. Used by
the tests that drive a whole stack the way a user does (interop, bad input, tracing, restarts).
`kairos(stack, *args)` runs the `kairos` command line against the stack the same way, and
`wait_for(what, check, dump)` polls until the cluster shows what a test expects (a loaded machine is
slow: the default wait is generous), failing with `dump()` (what kubectl shows) when it never does.
`apply(stack, *objects)` applies manifests built by `tests.e2e.manifests`; `listed(stack, kind, namespace)` is what `kubectl get -o json` lists. `kubesim_stack(state_dir, ...)` is
the stack these tests drive: the simulated API server with generated GPU nodes, stopped on exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.e2e.manifests import Manifest, documents
from tools.stack.supervisor import DEFAULT_REPLICAS, ClusterChoice, Stack, start_stack

T = TypeVar("T")
SETTLE = 60.0
RUN_DELAY = 0.1
"""Seconds the simulated kubelet takes from binding to Running."""
QUEUE_PERIOD = "0.5"
"""The queue service's cycle, shorter than its default so that a test waits less."""


@contextmanager
def kubesim_stack(
    state_dir: Path,
    *,
    nodes: int,
    gpus_per_node: int,
    options: dict[str, dict[str, str]] | None = None,
    env: Mapping[str, str] | None = None,
    shards: tuple[str, ...] = (),
    replicas: Mapping[str, int] | None = None,
    nats_cluster: int = 1,
) -> Iterator[Stack]:
    """A stack on the simulated API server with `nodes` generated nodes of `gpus_per_node` GPUs; `options`
    are added to the queue's short cycle; `shards` run beside the default one; `replicas` per service beyond
    one (`start_stack`); `nats_cluster` nats-servers as one JetStream cluster."""
    stack = start_stack(
        state_dir,
        replicas={**DEFAULT_REPLICAS, **(replicas or {})},
        cluster=ClusterChoice(kind="kubesim", nodes=nodes, gpus_per_node=gpus_per_node, run_delay=RUN_DELAY),
        options={"queue": {"period": QUEUE_PERIOD}, **(options or {})},
        env=env,
        shards=shards,
        nats_cluster=nats_cluster,
    )
    try:
        yield stack
    finally:
        stack.stop()


def kubectl(stack: Stack, *args: str, stdin: str | None = None) -> str:
    assert stack.kubeconfig is not None, "the stack runs no Kubernetes cluster"
    done = subprocess.run(
        ["kubectl", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": str(stack.kubeconfig)},
    )
    assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr}"
    return done.stdout


def apply(stack: Stack, *objects: Manifest, namespace: str | None = None) -> str:
    """`kubectl apply -f -` of `objects` (`tests.e2e.manifests`), in `namespace` when given."""
    where = ("-n", namespace) if namespace else ()
    return kubectl(stack, "apply", *where, "-f", "-", stdin=documents(*objects))


def listed(stack: Stack, kind: str, namespace: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(kubectl(stack, "get", kind, "-n", namespace, "-o", "json"))[
        "items"
    ]
    return items


def kairos(stack: Stack, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "tools.cli.main", *args, "--state-dir", str(stack.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def wait_for(
    what: str, check: Callable[[], T | None], dump: Callable[[], str] = lambda: "", settle: float = SETTLE
) -> T:
    """Poll `check()` every half second until it returns something truthy, which is returned."""
    deadline = time.monotonic() + settle
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            shown = dump()
            pytest.fail(f"{what} within {settle:.0f} s" + (f"; {shown[:4000]}" if shown else ""))
        time.sleep(0.5)
