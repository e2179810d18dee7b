"""Every KAI conformance case runs in-process and satisfies the judge (../shared/conformance/kai/SEMANTICS.md §8-9).

Cases listed in ``known_failures.yaml`` (beside this file) are strict xfails: they must fail,
so fixing one forces its removal from the list. The runner is imported inside the test, so
collection works even while the runner does not import.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance.known_failures import case_params, check_list
from tools.conformance import corpus_dir
from tools.conformance.case import load_case
from tools.conformance.judge import judge

CORPUS = corpus_dir()
KNOWN_FAILURES_FILE = Path(__file__).with_name("known_failures.yaml")
MAX_KNOWN_FAILURES = 4


@pytest.mark.conformance
@pytest.mark.parametrize("path", case_params({"": CORPUS}, KNOWN_FAILURES_FILE))
def test_kai_case(path: Path) -> None:
    from tools.conformance.runner import run_case

    case = load_case(path)
    mismatches = judge(case, run_case(case))
    assert not mismatches, f"{len(mismatches)} mismatch(es):\n" + "\n".join(mismatches)


def test_known_failures_list_is_short_and_explained() -> None:
    check_list(KNOWN_FAILURES_FILE, {"": CORPUS}, MAX_KNOWN_FAILURES)
