"""The real kubectl against a stack's cluster, for the end-to-end tests.

`kubectl(stack, *args, stdin=...)` runs kubectl with the stack's kubeconfig (the simulated API server
`start_stack` runs) and returns its stdout; a non-zero exit fails the test with kubectl's stderr. Used by
the tests that drive a whole stack the way a user does (interop, bad input, tracing, restarts).
"""

from __future__ import annotations

import os
import subprocess

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
