"""The in-repo copy of the KAI conformance corpus must stay byte-identical to the shared corpus."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_REPO_CASES = REPO_ROOT / "tests" / "conformance" / "kai" / "cases"
SHARED_CASES = REPO_ROOT.parent / "shared" / "conformance" / "kai" / "cases"

EXPECTED_CASE_COUNT = 75


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


def test_in_repo_copy_has_all_cases() -> None:
    assert len(list(IN_REPO_CASES.rglob("*.yaml"))) == EXPECTED_CASE_COUNT


def test_in_repo_copy_matches_shared_corpus() -> None:
    if not SHARED_CASES.is_dir():
        pytest.skip(f"no shared corpus at {SHARED_CASES} (fresh clone): nothing to compare against")
    shared = _files(SHARED_CASES)
    in_repo = _files(IN_REPO_CASES)
    assert sorted(in_repo) == sorted(shared), "the in-repo copy and the shared corpus hold different files"
    differing = sorted(name for name in shared if in_repo[name] != shared[name])
    assert not differing, f"files whose bytes differ from the shared corpus: {differing}"
