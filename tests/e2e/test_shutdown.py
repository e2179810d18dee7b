"""SIGTERM ends a busy stack within a few seconds: every service drains what it is doing and exits.

Under a load the state service once kept answering every bind request already queued on its subscription,
and a binder finished every proposal of its fetched batch (each waiting on a state service that was itself
going away), so `Stack.stop` had to SIGKILL them after 10 s. Here SIGTERM reaches every service at once in
the middle of binding thousands of pods, as `Stack.stop` (and Kubernetes, on a rollout) sends it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

from shared.bus import service as runner
from shared.model import PodStatus
from tests.e2e.invariants import BOUND, Observer, load
from tools.stack.nats_server import start_nats_server
from tools.stack.supervisor import start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

EXIT_WITHIN_S = 8.0
"""Generous for a loaded 2-core machine; `Stack.stop` gives the whole stack 10 s before SIGKILL."""


async def _load_until_busy(url: str) -> dict[str, int]:
    await load(url, nodes=400, pods=3000)
    observer = await Observer.open(url, "shutdown-test")
    try:
        await observer.until("the first 200 binds", lambda: observer.count(*BOUND) >= 200, timeout=300)
        return {"bound": observer.count(*BOUND), "pending": observer.count(PodStatus.PENDING)}
    finally:
        await observer.close()


@pytest.mark.timeout(600)
def test_sigterm_stops_every_busy_service_within_seconds(tmp_path: Path) -> None:
    stack = start_stack(
        tmp_path / "stack",
        replicas={"state": 1, "queue": 1, "placement": 1, "binder": 2},
        options={"state": {"source": "sim"}, "queue": {"batch": "100", "period": "0.5"}},
    )
    exits: dict[str, float] = {}
    try:
        before = asyncio.run(_load_until_busy(stack.url))
        assert before["pending"] > 0, f"the load finished before the stop: {before}"
        started = time.monotonic()
        for proc in stack.processes.values():
            proc.send_signal(signal.SIGTERM)
        deadline = started + 30.0
        while len(exits) < len(stack.processes) and time.monotonic() < deadline:
            for name, proc in stack.processes.items():
                if name not in exits and proc.poll() is not None:
                    exits[name] = time.monotonic() - started
            time.sleep(0.05)
    finally:
        stack.stop()
    summary = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in sorted(exits.items()))
    print(f"\nSIGTERM with {before['bound']} pods bound and {before['pending']} pending; exits: {summary}")
    missing = sorted(set(stack.processes) - set(exits))
    assert not missing, f"still running 30 s after SIGTERM: {missing} (exits: {summary})"
    slow = {name: round(t, 1) for name, t in exits.items() if t > EXIT_WITHIN_S}
    assert not slow, f"took longer than {EXIT_WITHIN_S} s to exit after SIGTERM: {slow}"
    codes = {name: proc.returncode for name, proc in stack.processes.items() if proc.returncode != 0}
    assert not codes, f"exited with an error after SIGTERM: {codes}"


@pytest.mark.timeout(120)
def test_a_body_that_ignores_sigterm_is_cancelled_after_the_stop_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's last resort: a body still busy `STOP_DEADLINE_S` after SIGTERM is cancelled (its
    `finally` runs) and the process's `serve` returns normally."""
    monkeypatch.setattr(runner, "STOP_DEADLINE_S", 0.5)
    server = start_nats_server(tmp_path / "nats")
    seen: list[str] = []

    async def stubborn(ctx: runner.ServiceContext) -> None:
        ctx.ready = True
        os.kill(os.getpid(), signal.SIGTERM)  # through the runner's own handler
        await ctx.stopping.wait()
        seen.append("stopping")
        try:
            await asyncio.sleep(3600)  # busy well past any deadline
        finally:
            seen.append("cancelled")

    config = runner.parse_config("stubborn", ["--nats-url", server.url, "--replica", "stubborn-0"])
    try:
        asyncio.run(asyncio.wait_for(runner.serve("stubborn", config, stubborn), timeout=60))
    finally:
        server.stop()
    assert seen == ["stopping", "cancelled"]
