"""The in-repo copies of the KAI conformance corpus must stay byte-identical to the shared corpus (KAI
v0.17's tests, ../shared/conformance/kai-v0.17), and the runner must read that corpus by default."""

from pathlib import Path

import pytest

from tests.conformance.known_failures import load
from tools.conformance import IN_REPO_CORPUS, SHARED_CORPUS, corpus_dir

IN_REPO = IN_REPO_CORPUS
SHARED = SHARED_CORPUS

# Each folder of the corpus (tools.conformance.FOLDERS) with the number of cases it holds.
EXPECTED_CASE_COUNTS = {"cases": 80, "actions": 162, "actions-config": 21}


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


@pytest.mark.parametrize("folder", EXPECTED_CASE_COUNTS)
def test_the_runner_reads_kai_v0_17_s_corpus(folder: str) -> None:
    expected = SHARED / folder if (SHARED / folder).is_dir() else IN_REPO / folder
    assert corpus_dir(folder) == expected


def test_the_copy_says_where_it_comes_from() -> None:
    notice = (IN_REPO / "NOTICE").read_text(encoding="utf-8")
    assert "d5bc503a146317e51037d89775d77172c6d12f71" in notice
    assert "Apache License, Version 2.0" in notice


def test_the_readme_states_the_corpus_as_it_is() -> None:
    """The README's counts are the corpus's and the extra cases' file counts, and it says "all ... pass,
    none on a known-failure list" only while both known-failure lists are empty."""
    here = Path(__file__).resolve().parent
    readme = (here.parents[1] / "README.md").read_text(encoding="utf-8")
    text = " ".join(readme.split())
    counts = {folder: len(list((IN_REPO / folder).rglob("*.yaml"))) for folder in EXPECTED_CASE_COUNTS}
    assert f"all {counts['cases']} integration cases" in text
    assert f"all {counts['actions']} action-level cases" in text
    assert f"all {counts['actions-config']} that also configure" in text
    extra = len(list((here / "extra").rglob("*.yaml")))
    assert f"{extra} further cases" in text
    known = [load(here / "known_failures.yaml"), load(here / "known_failures_single_session.yaml")]
    assert "none on a known-failure list" in text
    assert known == [{}, {}], "the README says no case is on a known-failure list"
