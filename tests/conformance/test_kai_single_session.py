"""Every single-session KAI case (``actions/`` and ``actions-config/``) runs in-process and satisfies the
judge: one session, only its actions, matched on that same session (../shared/conformance/kai/SEMANTICS.md §13).

Cases listed in ``known_failures_single_session.yaml`` (beside this file) are strict xfails: they must
fail, so fixing one forces its removal from the list. A case the runner refuses (a scheduler conf Kairos's
policy cannot express) fails with the refusal.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from shared.errors import InvalidObject
from tests.conformance.known_failures import case_params, check_list
from tools.conformance import corpus_dir
from tools.conformance.case import load_case
from tools.conformance.judge import judge

FOLDERS = ("actions", "actions-config")
KNOWN_FAILURES_FILE = Path(__file__).with_name("known_failures_single_session.yaml")
MAX_KNOWN_FAILURES = 8


ROOTS = {folder: corpus_dir(folder) for folder in FOLDERS}


@pytest.mark.conformance
@pytest.mark.parametrize("path", case_params(ROOTS, KNOWN_FAILURES_FILE))
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
    check_list(KNOWN_FAILURES_FILE, ROOTS, MAX_KNOWN_FAILURES)
