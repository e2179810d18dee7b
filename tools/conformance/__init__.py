"""Kairos's KAI conformance kit: case schema, runner output, judge (and the runner itself).

Modules: ``case`` (load and validate a corpus YAML file), ``result`` (the runner's output
structs), ``judge`` (compare the two, SEMANTICS §8-9), ``runner`` / ``build`` (run a case
in-process), ``scheduler_conf`` (a case's KAI plugin tiers as a policy). Used by ``kairos
conformance`` and the test suites. This module only knows where the corpus's folders live, so the
command and the tests look in the same places.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["FOLDERS", "corpus_dir"]

_REPO_ROOT = Path(__file__).resolve().parents[2]

FOLDERS = ("cases", "actions", "actions-config")
"""The corpus's folders: integration cases (the round loop), single-session action cases, and action
cases that need session overrides or a scheduler conf (SEMANTICS §1, §13)."""


def _candidates(folder: str) -> tuple[Path, Path]:
    # The project's own copy comes first so a fresh clone tests the same cases; the workplace's
    # folder beside the repository is the fallback while the copy does not exist yet.
    return (
        _REPO_ROOT / "tests" / "conformance" / "kai" / folder,
        _REPO_ROOT.parent / "shared" / "conformance" / "kai" / folder,
    )


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
