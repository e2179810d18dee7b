"""The KAI integration cases the public corpus leaves out (see extra/NOTICE) pass too.

The public corpus is a sample; these are the other cases of the same KAI test files, converted the same
way, so that the semantics are checked beyond the sample.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.conformance.case import iter_case_files, load_case
from tools.conformance.judge import judge

EXTRA = Path(__file__).with_name("extra")


@pytest.mark.conformance
@pytest.mark.parametrize(
    "path", [pytest.param(p, id=p.relative_to(EXTRA).as_posix()) for p in iter_case_files([EXTRA])]
)
def test_extra_kai_case(path: Path) -> None:
    from tools.conformance.runner import run_case

    case = load_case(path)
    mismatches = judge(case, run_case(case))
    assert not mismatches, f"{len(mismatches)} mismatch(es):\n" + "\n".join(mismatches)


def test_the_extra_set_is_present() -> None:
    assert len(iter_case_files([EXTRA])) >= 40
