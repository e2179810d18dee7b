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
from shared.errors import TemporaryError
from shared.security.permissions import ADMIN, IDENTITIES, OPERATOR, PLACEMENT
from tests.e2e.scenarios import RECLAIMING_JOB, reclaim, wait_running
from tools.stack.supervisor import start_stack

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SETTLE = 90.0
TRIED = "refused-attempt-Zq81"
"""The password a refused client tries: it must not be logged either."""


async def _drive(operator_url: str, plain_url: str) -> None:
    """As the operator: a queue borrowing the whole node, then a reclaim (binds, then evictions)."""
    client = await BusClient.connect(operator_url)
    try:
        await reclaim(client, SETTLE)
        await wait_running(client, RECLAIMING_JOB, 2, SETTLE)
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
        assert RECLAIMING_JOB in status.stdout
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
