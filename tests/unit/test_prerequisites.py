"""`tools/prerequisites.sh`, the check `make` runs before it installs into .venv: a missing Python, one
too old, or one without its venv module gets one line naming what is missing and how to get it, and exit
status 2; a good one passes silently.

The unsuitable interpreters are small shell scripts that answer the check's three questions (version
test, version text, venv import) as such an interpreter would: no old Python or venv-less Python is
installed here to run instead.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tools.cli import up

SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "prerequisites.sh"

OLD_PYTHON = """#!/bin/sh
case "$2" in
  *print*) echo 3.9 ;;
  *version_info*) exit 1 ;;
esac
"""
NO_VENV = """#!/bin/sh
case "$2" in
  *ensurepip*) echo "ModuleNotFoundError: No module named 'ensurepip'" >&2; exit 1 ;;
esac
exit 0
"""


def check(python: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", str(SCRIPT), python], capture_output=True, text=True, timeout=30, check=False
    )


def fake(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(body)
    path.chmod(0o755)
    return str(path)


def test_a_python_new_enough_with_venv_passes_silently() -> None:
    done = check(sys.executable)
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")


@pytest.mark.parametrize(
    ("interpreter", "says"),
    [
        (None, ["'python3.99-missing' not found", "install Python 3.11 or newer", "make PYTHON="]),
        (OLD_PYTHON, ["is Python 3.9", "needs 3.11 or newer", "make PYTHON="]),
        (NO_VENV, ["has no venv module", "apt-get install python3-venv"]),
    ],
    ids=["missing", "too old", "no venv module"],
)
def test_an_unsuitable_python_gets_one_line_naming_what_is_missing_and_exit_status_2(
    tmp_path: Path, interpreter: str | None, says: list[str]
) -> None:
    python = "python3.99-missing" if interpreter is None else fake(tmp_path, "python", interpreter)
    done = check(python)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("kairos: ")
    for words in says:
        assert words in lines[0]
    assert "Traceback" not in done.stderr


def test_kairos_up_names_a_missing_kubectl_in_one_line_with_where_to_get_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    up._note_missing_kubectl()
    missing = capsys.readouterr()
    assert missing.out == ""
    assert missing.err.splitlines() == [up.KUBECTL_MISSING]
    assert "kubectl not found" in up.KUBECTL_MISSING
    assert "https://kubernetes.io/docs/tasks/tools/" in up.KUBECTL_MISSING

    fake(tmp_path, "kubectl", "#!/bin/sh\n")
    up._note_missing_kubectl()
    assert capsys.readouterr() == ("", "")
