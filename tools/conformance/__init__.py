"""Kairos's KAI conformance kit: case schema, runner output, judge (and the runner itself).

Modules: ``case`` (load and validate a corpus YAML file), ``result`` (the runner's output
structs), ``judge`` (compare the two, SEMANTICS §8-9), ``runner`` / ``build`` (run a case
in-process). Used by ``kairos conformance`` and the test suites. This module only knows where
the corpus lives, so the command and the tests look in the same places.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["corpus_dir"]

_REPO_ROOT = Path(__file__).resolve().parents[2]

# The project's own copy comes first so a fresh clone tests the same cases; the workplace's
# folder beside the repository is the fallback while the copy does not exist yet.
_CORPUS_CANDIDATES = (
    _REPO_ROOT / "tests" / "conformance" / "kai" / "cases",
    _REPO_ROOT.parent / "shared" / "conformance" / "kai" / "cases",
)


def corpus_dir() -> Path:
    """Return the KAI corpus's ``cases/`` folder; ``FileNotFoundError`` when neither copy exists."""
    for candidate in _CORPUS_CANDIDATES:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in _CORPUS_CANDIDATES)
    raise FileNotFoundError(2, f"no KAI corpus found (tried {tried})", str(_CORPUS_CANDIDATES[0]))
