"""Every single-session KAI case (``actions/`` and ``actions-config/``) runs in-process and satisfies the
judge: one session, only its actions, matched on that same session (SEMANTICS.md §13).

Cases listed in ``known_failures_single_session.yaml`` (beside this file) are strict xfails: they must
fail, so fixing one forces its removal from the list. A case the runner refuses (a scheduler conf Kairos's
policy cannot express) fails with the refusal.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shared.errors import InvalidObject
from tools.conformance import corpus_dir
from tools.conformance.case import iter_case_files, load_case
from tools.conformance.judge import judge

FOLDERS = ("actions", "actions-config")
KNOWN_FAILURES_FILE = Path(__file__).with_name("known_failures_single_session.yaml")
MAX_KNOWN_FAILURES = 8


def _known_failures() -> dict[str, str]:
    loaded = yaml.safe_load(KNOWN_FAILURES_FILE.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _params() -> list[object]:
    known = _known_failures()
    params: list[object] = []
    for folder in FOLDERS:
        root = corpus_dir(folder)
        for path in iter_case_files([root]):
            rel = f"{folder}/{path.relative_to(root).as_posix()}"
            reason = known.get(rel)
            marks = [pytest.mark.xfail(strict=True, reason=str(reason))] if reason is not None else []
            params.append(pytest.param(path, id=rel, marks=marks))
    return params


@pytest.mark.conformance
@pytest.mark.parametrize("path", _params())
def test_kai_single_session_case(path: Path) -> None:
    from tools.conformance.runner import run_case

    case = load_case(path)
    assert case.harness.single_session
    try:
        result = run_case(case, str(path))
    except InvalidObject as exc:
        pytest.fail(f"refused: {exc.field}: {exc.problem}")
    assert len(result.rounds) == 1
    assert len(result.checkpoints) == 1
    mismatches = judge(case, result)
    assert not mismatches, f"{len(mismatches)} mismatch(es):\n" + "\n".join(mismatches)


def test_known_failures_list_is_short_and_explained() -> None:
    loaded = yaml.safe_load(KNOWN_FAILURES_FILE.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), f"{KNOWN_FAILURES_FILE.name} must be a mapping (use {{}} when empty)"
    assert len(loaded) <= MAX_KNOWN_FAILURES, f"{len(loaded)} known failures, at most {MAX_KNOWN_FAILURES}"
    for rel, reason in loaded.items():
        assert isinstance(rel, str), f"{rel!r}: the key must be a case path"
        folder, _, inner = rel.partition("/")
        assert folder in FOLDERS, f"{rel}: must start with one of {', '.join(FOLDERS)}"
        assert (corpus_dir(folder) / inner).is_file(), f"{rel}: names no case under {corpus_dir(folder)}"
        assert isinstance(reason, str), f"{rel}: the reason must be a string"
        assert reason.strip(), f"{rel}: empty reason"
        assert "\n" not in reason.strip(), f"{rel}: the reason must be one line"
