"""What the supervision tests share: `kairos up`'s supervisor loop run in a thread, the pods kubectl shows
running, and the independent check that every pod is bound exactly once (`tests.e2e.invariants`).

Used by tests/e2e/test_supervision.py and tests/e2e/test_nats_cluster.py.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from tests.e2e.invariants import BOUND, Observer
from tests.e2e.kubectl import kubectl
from tools.stack.supervision import Supervisor
from tools.stack.supervisor import Stack


@contextmanager
def supervised(stack: Stack, lines: list[str]) -> Iterator[Supervisor]:
    """The supervisor of `stack` polling every 0.2 s in a thread, as `kairos up` does in its main loop;
    what it says goes to `lines`."""
    supervisor = Supervisor(stack, time.time(), say=lines.append)
    stop = threading.Event()

    def supervise() -> None:
        while not stop.is_set():
            supervisor.poll(time.time())
            stop.wait(0.2)

    loop = threading.Thread(target=supervise, daemon=True)
    loop.start()
    try:
        yield supervisor
    finally:
        stop.set()
        loop.join(5)


def running_pods(stack: Stack) -> dict[str, str]:
    """Pod name -> node, for every pod kubectl shows Running on a node."""
    listed = json.loads(kubectl(stack, "get", "pods", "-o", "json"))["items"]
    return {
        p["metadata"]["name"]: p["spec"]["nodeName"]
        for p in listed
        if p["status"].get("phase") == "Running" and p["spec"].get("nodeName")
    }


def bound_once(stack: Stack, pods: int, name: str) -> dict[str, int]:
    """Once `pods` pods are bound in the state bucket, the independent check (every pod bound exactly once,
    no GPU over-committed); pods per status."""

    async def check() -> dict[str, int]:
        observer = await Observer.open(stack.url, name)
        try:
            await observer.until(
                "every pod bound in the state bucket", lambda: observer.count(*BOUND) >= pods, 60
            )
            return observer.check()
        finally:
            await observer.close()

    return asyncio.run(check())
