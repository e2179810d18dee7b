"""The real kubectl against a stack's cluster, for the end-to-end tests.

`kubectl(stack, *args, stdin=...)` runs kubectl with the stack's kubeconfig (the simulated API server
`start_stack` runs) and returns its stdout; a non-zero exit fails the test with kubectl's stderr. Used by
the tests that drive a whole stack the way a user does (interop, bad input, tracing, restarts).
`kairos(stack, *args)` runs the `kairos` command line against the stack the same way, and
`wait_for(what, check, dump)` polls until the cluster shows what a test expects (a loaded machine is
slow: the default wait is generous), failing with `dump()` (what kubectl shows) when it never does.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import TypeVar

import pytest

from tools.stack.supervisor import Stack

T = TypeVar("T")
SETTLE = 60.0


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
