"""Kairos's KAI conformance kit: case schema, runner output, judge (and the runner itself).

Modules: ``case`` (load and validate a corpus YAML file), ``result`` (the runner's output
structs), ``judge`` (compare the two, SEMANTICS §8-9), ``runner`` / ``build`` (run a case
in-process), ``scheduler_conf`` (a case's KAI plugin tiers as a policy). Used by ``kairos
conformance`` and the test suites. This module only knows where the corpus's folders live, so the
command and the tests look in the same places.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FOLDERS", "IN_REPO_CORPUS", "SHARED_CORPUS", "corpus_dir"]

_REPO_ROOT = Path(__file__).resolve().parents[2]

FOLDERS = ("cases", "actions", "actions-config")
"""The corpus's folders: integration cases (the round loop), single-session action cases, and action
cases that need session overrides or a scheduler conf (SEMANTICS §1, §13)."""


SHARED_CORPUS = _REPO_ROOT.parent / "shared" / "conformance" / "kai-v0.17"
"""The workplace's corpus beside the repository: KAI v0.17's tests, converted (../shared/conformance/kai/SEMANTICS.md §14)."""

IN_REPO_CORPUS = _REPO_ROOT / "tests" / "conformance" / "kai"
"""The project's byte-identical copy of `SHARED_CORPUS` (tests/conformance/test_corpus_copy.py)."""


def _candidates(folder: str) -> tuple[Path, Path]:
    # The workplace's v0.17 corpus comes first: it is the one the project keeps up with; the project's
    # own copy of it is what a fresh clone, without the folder beside it, tests.
    return (SHARED_CORPUS / folder, IN_REPO_CORPUS / folder)


def corpus_dir(folder: str = "cases") -> Path:
    """Return one of the KAI corpus's `FOLDERS` (``cases/`` by default); ``FileNotFoundError`` when
    neither copy exists, ``ValueError`` for a folder the corpus does not have."""
    if folder not in FOLDERS:
        raise ValueError(f"no corpus folder {folder!r} (known: {', '.join(FOLDERS)})")
    candidates = _candidates(folder)
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(2, f"no KAI corpus found (tried {tried})", str(candidates[0]))
