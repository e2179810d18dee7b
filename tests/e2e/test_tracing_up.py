"""`kairos up --otlp URL` sends every service's traces to that collector, also when the stack runs detached;
a URL that is not one is refused before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.otlp_receiver import OtlpReceiver, ReceivedSpan

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SERVICES = {"kairos-state", "kairos-queue", "kairos-placement", "kairos-binder"}
WORKLOAD = """
queues:
  - {name: traced, parent: org, gpu: {quota: 8, over_quota_weight: 1, limit: -1},
     cpu: {quota: -1, over_quota_weight: 1, limit: -1}, memory: {quota: -1, over_quota_weight: 1, limit: -1}}
podgroups:
  - {name: traced-gang, queue: traced, root: {name: root, pod_sets: [{name: default, min_available: 2}]}}
pods:
  - {name: traced-gang-0, uid: traced-gang-0, podgroup: traced-gang, cpu_millis: 1000, memory_bytes: 1000000000, gpu: {devices: 1}}
  - {name: traced-gang-1, uid: traced-gang-1, podgroup: traced-gang, cpu_millis: 1000, memory_bytes: 1000000000, gpu: {devices: 1}}
"""


def kairos(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_detached_stack_exports_every_services_spans(tmp_path: Path, otlp: OtlpReceiver) -> None:
    state = tmp_path / "kairos"
    up = kairos("up", "--detach", "--memory", "--state-dir", str(state), "--otlp", otlp.url)
    assert up.returncode == 0, up.stderr + (
        (state / "up.log").read_text() if (state / "up.log").exists() else ""
    )
    try:
        workload = tmp_path / "work.yaml"
        workload.write_text(WORKLOAD)
        submitted = kairos("submit", str(workload), "--state-dir", str(state))
        assert submitted.returncode == 0, submitted.stderr

        def whole_trace(spans: list[ReceivedSpan]) -> set[str] | None:
            commits = [
                s
                for s in spans
                if s.name == "binder.commit" and s.attributes.get("kairos.podgroup") == "traced-gang"
            ]
            if not commits:
                return None
            services = {s.service for s in spans if s.trace_id == commits[0].trace_id}
            return services if services >= SERVICES else None

        # `--otlp` exports with the SDK's default batch delay (5 s): give it a few rounds.
        assert otlp.wait_for(whole_trace, timeout=90) >= SERVICES
    finally:
        down = kairos("down", "--state-dir", str(state))
    assert down.returncode == 0, down.stderr


def test_an_otlp_flag_that_is_not_a_url_is_refused_before_anything_starts(tmp_path: Path) -> None:
    up = kairos(
        "up", "--detach", "--memory", "--state-dir", str(tmp_path / "kairos"), "--otlp", "jaeger:4318"
    )
    assert up.returncode != 0
    assert "--otlp" in up.stderr
    assert not (tmp_path / "kairos" / "stack.json").exists()
