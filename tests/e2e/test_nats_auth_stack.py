"""The local stack with NATS authentication (its default): every service runs as its own identity, real
work (binds and a reclaim's evictions) goes through without a single permission violation, and no
password appears in any service's log, the simulated API server's or nats-server's, not even one a
refused client tried.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

from shared.bus.client import BusClient
from shared.bus.connection import NatsAuth, connect
from shared.contracts.messages import ApplyRequest
from shared.errors import TemporaryError
from shared.model import PodStatus, Queue, QueueResource
from shared.model.builders import gang, gpu_nodes
from shared.security.permissions import ADMIN, IDENTITIES, OPERATOR, PLACEMENT
from tools.stack.supervisor import start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTLE = 90.0
UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)
TRIED = "refused-attempt-Zq81"
"""The password a refused client tries: it must not be logged either."""


async def _running(client: BusClient, prefix: str, count: int) -> None:
    async with asyncio.timeout(SETTLE):
        while True:
            reply = await client.snapshot()
            pods = [p for p in reply.pods if p.name.startswith(prefix) and p.status == PodStatus.RUNNING]
            if len(pods) >= count:
                return
            await asyncio.sleep(0.3)


async def _drive(operator_url: str, plain_url: str) -> None:
    """As the operator: a queue borrowing the whole node, then a reclaim (binds, then evictions)."""
    client = await BusClient.connect(operator_url)
    try:
        queues = (
            Queue(name="org", gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
            Queue(
                name="a",
                parent="org",
                creation_index=1,
                gpu=QueueResource(quota=2),
                cpu=UNBOUNDED,
                memory=UNBOUNDED,
            ),
            Queue(
                name="b",
                parent="org",
                creation_index=2,
                gpu=QueueResource(quota=2),
                cpu=UNBOUNDED,
                memory=UNBOUNDED,
            ),
        )
        borrowed = [gang(f"a-{i}", "a", 1, 1.0, created=float(i)) for i in range(4)]
        reply = await client.apply(
            ApplyRequest(
                nodes=tuple(gpu_nodes(1, gpus=4)),
                queues=queues,
                podgroups=tuple(pg for pg, _ in borrowed),
                pods=tuple(p for _, pods in borrowed for p in pods),
            )
        )
        assert reply.ok, reply.error
        await _running(client, "a-", 4)
        group, pods = gang("b-job", "b", 2, 1.0, created=10.0)
        reply = await client.apply(ApplyRequest(podgroups=(group,), pods=tuple(pods)))
        assert reply.ok, reply.error
        await _running(client, "b-job", 2)
    finally:
        await client.close()
    with pytest.raises(TemporaryError):
        await connect(plain_url, "intruder", auth=NatsAuth(user=PLACEMENT, password=TRIED), timeout=2.0)


def test_a_stack_with_authentication_works_and_logs_no_secret(tmp_path: Path) -> None:
    state_dir = tmp_path / "kairos"
    stack = start_stack(
        state_dir,
        options={"state": {"source": "sim"}, "queue": {"period": "0.5"}},
        env={"KAIROS_LOG_LEVEL": "DEBUG"},
    )
    try:
        assert set(stack.passwords) == {*IDENTITIES, ADMIN}
        asyncio.run(_drive(stack.url_as(OPERATOR), stack.nats.url))
        # The CLI finds the operator's credentials in the state directory.
        status = subprocess.run(
            [sys.executable, "-m", "tools.cli.main", "status", "--state-dir", str(state_dir), "--all"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert "b-job" in status.stdout
    finally:
        stack.stop()
    for path in (state_dir / "auth").iterdir():
        assert path.stat().st_mode & 0o777 == 0o600, path
    assert (state_dir / "nats-server.conf").stat().st_mode & 0o777 == 0o600
    assert state_dir.stat().st_mode & 0o777 == 0o700

    logs = [*sorted((state_dir / "logs").glob("*.log")), state_dir / "nats-server.log"]
    assert len(logs) >= 5
    text = {path.name: path.read_text(errors="replace") for path in logs}
    # The logs were written while the work went through (DEBUG: each proposal is a line).
    assert "2 evictions" in text["placement-0.log"]
    for secret in [*stack.passwords.values(), TRIED]:
        leaked = [name for name, t in text.items() if secret in t]
        assert leaked == [], f"a password appears in {leaked}"
    assert not [name for name, t in text.items() if ":***@" not in t and "@127.0.0.1" in t]
    server_log = text["nats-server.log"]
    assert 'authentication error - User "placement"' in server_log  # the refused client, by name only
    assert [line for line in server_log.splitlines() if "Permissions Violation" in line] == []
