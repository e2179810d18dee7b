"""The in-repo copies of the KAI conformance corpus must stay byte-identical to the shared corpus."""

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
IN_REPO = REPO_ROOT / "tests" / "conformance" / "kai"
SHARED = REPO_ROOT.parent / "shared" / "conformance" / "kai"

# Each folder of the corpus (tools.conformance.FOLDERS) with the number of cases it holds.
EXPECTED_CASE_COUNTS = {"cases": 75, "actions": 150, "actions-config": 13}


def _files(root: Path) -> dict[str, bytes]:
    return {
        path.relative_to(root).as_posix(): path.read_bytes() for path in root.rglob("*") if path.is_file()
    }


@pytest.mark.parametrize(("folder", "count"), EXPECTED_CASE_COUNTS.items())
def test_in_repo_copy_has_all_cases(folder: str, count: int) -> None:
    assert len(list((IN_REPO / folder).rglob("*.yaml"))) == count


@pytest.mark.parametrize("folder", EXPECTED_CASE_COUNTS)
def test_in_repo_copy_matches_shared_corpus(folder: str) -> None:
    shared_folder = SHARED / folder
    if not shared_folder.is_dir():
        pytest.skip(f"no shared corpus at {shared_folder} (fresh clone): nothing to compare against")
    shared = _files(shared_folder)
    in_repo = _files(IN_REPO / folder)
    assert sorted(in_repo) == sorted(shared), (
        f"the in-repo copy and the shared {folder}/ hold different files"
    )
    differing = sorted(name for name in shared if in_repo[name] != shared[name])
    assert not differing, f"files whose bytes differ from the shared {folder}/: {differing}"


def test_the_copies_are_the_corpus_folders() -> None:
    from tools.conformance import FOLDERS

    assert tuple(EXPECTED_CASE_COUNTS) == FOLDERS
