"""The real kubectl against a stack's cluster, for the end-to-end tests.

`kubectl(stack, *args, stdin=...)` runs kubectl with the stack's kubeconfig (the simulated API server
`start_stack` runs) and returns its stdout; a non-zero exit fails the test with kubectl's stderr. Used by
the tests that drive a whole stack the way a user does (interop, bad input, tracing, restarts).
`kairos(stack, *args)` runs the `kairos` command line against the stack the same way.
"""

from __future__ import annotations

import os
import subprocess
import sys

from shared.cli.stack import Stack


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
        [sys.executable, "-m", "shared.cli.main", *args, "--state-dir", str(stack.state_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout
