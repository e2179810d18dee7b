"""A fresh clone needs one command to run the stack: `make run` on a copy of the repository with no
`.venv` installs Kairos, starts the stack, prints `ready`; the real kubectl then sees a pod bound, and
Ctrl-C (SIGINT to make's process group) stops every process of the stack.

`make test` on a fresh clone is what CI runs (`.ci/run`), so that half is proved there. The copy holds the
working tree's files that git tracks or does not ignore (uncommitted edits included); pip reads its
usual cache, so the install costs what a second clone's would.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tools.stack.nats_server import pid_alive

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
READY_WITHIN = 480.0
"""Seconds for the install (about 30 with pip's cache warm, more on a cold machine) and the start."""


def tracked_copy(destination: Path) -> Path:
    """The working tree as a clone of it would hold it: the files git tracks and the new ones it does not
    ignore, as they are now; never `.venv` or other ignored output."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        name = raw.decode()
        source = REPO / name
        if not source.is_file():
            continue  # deleted in the working tree, not yet committed
        target = destination / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target)
    return destination


def lines_of(stream: object) -> tuple[queue.Queue[str | None], threading.Thread]:
    """The process's output, line by line, read on a thread (None at its end), and that thread."""
    out: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        for line in stream:  # type: ignore[attr-defined]
            out.put(line.rstrip("\n"))
        out.put(None)

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    return out, reader


def wait_for_line(out: queue.Queue[str | None], wanted: str, seen: list[str], within: float) -> None:
    deadline = time.monotonic() + within
    while (left := deadline - time.monotonic()) > 0:
        try:
            line = out.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            pytest.fail("make run ended before it was ready:\n" + "\n".join(seen[-40:]))
        seen.append(line)
        if line.strip() == wanted:
            return
    pytest.fail(f"no {wanted!r} from make run within {within:.0f} s:\n" + "\n".join(seen[-40:]))


@pytest.fixture
def fresh_clone(tmp_path: Path) -> Path:
    clone = tracked_copy(tmp_path / "kairos")
    assert not (clone / ".venv").exists()
    return clone


@pytest.mark.timeout(600)
def test_make_run_on_a_fresh_clone_installs_starts_binds_a_pod_and_stops_on_ctrl_c(fresh_clone: Path) -> None:
    kubectl = shutil.which("kubectl")
    assert kubectl is not None, "the e2e tests drive the stack with the real kubectl"
    make = subprocess.Popen(
        ["make", "run"],
        cwd=fresh_clone,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
    )
    seen: list[str] = []
    state = fresh_clone / ".kairos"
    out, reader = lines_of(make.stdout)
    try:
        wait_for_line(out, "ready", seen, READY_WITHIN)
        assert (fresh_clone / ".venv" / ".installed").exists(), "the install's stamp"
        env = {**os.environ, "KUBECONFIG": str(state / "kubeconfig"), "HOME": str(fresh_clone)}
        applied = subprocess.run(
            [kubectl, "apply", "-f", str(fresh_clone / "examples/kai/gpu-pod.yaml")],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
        deadline = time.monotonic() + 60
        node = ""
        while not node:
            got = subprocess.run(
                [kubectl, "get", "pod", "gpu-pod", "-o", "jsonpath={.spec.nodeName}"],
                capture_output=True,
                text=True,
                env=env,
                timeout=60,
                check=False,
            )
            node = got.stdout.strip()
            assert time.monotonic() < deadline, f"gpu-pod never bound: {got.stderr}\n" + "\n".join(seen[-40:])
            if not node:
                time.sleep(0.5)
        processes = json.loads((state / "stack.json").read_text())
        pids = [processes["nats"], *processes["services"].values()]
        assert all(pid_alive(pid) for pid in pids)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGINT)
        try:
            make.wait(timeout=90)
        except subprocess.TimeoutExpired:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
        reader.join(timeout=10)
        assert make.stdout is not None
        make.stdout.close()
    assert not (state / "ready").exists(), "the stack took its ready mark away as it stopped"
    still = [pid for pid in pids if pid_alive(pid)]
    assert not still, f"processes of the stack left running after Ctrl-C: {still}"
