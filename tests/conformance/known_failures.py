"""The corpus specs' parameters: one pytest param per case file, with the known failures as strict xfails.

A known-failures file maps a case's path (relative to its corpus folder, prefixed with the folder's name
where a spec covers several folders) to a one-line reason. A strict xfail must fail, so a case that starts
passing forces its removal from the list. Used by test_kai_corpus.py and test_kai_single_session.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tools.conformance.case import iter_case_files


def load(file: Path) -> dict[str, str]:
    loaded = yaml.safe_load(file.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def case_params(roots: Mapping[str, Path], known_file: Path) -> list[object]:
    """Every case under `roots` (prefix -> folder; the prefix "" names paths without a folder)."""
    known = load(known_file)
    params: list[object] = []
    for prefix, root in roots.items():
        for path in iter_case_files([root]):
            rel = path.relative_to(root).as_posix()
            rel = f"{prefix}/{rel}" if prefix else rel
            reason = known.get(rel)
            marks = [pytest.mark.xfail(strict=True, reason=str(reason))] if reason is not None else []
            params.append(pytest.param(path, id=rel, marks=marks))
    return params


def check_list(known_file: Path, roots: Mapping[str, Path], most: int) -> None:
    """The list is a mapping of at most `most` entries, each naming a case under `roots` with a one-line
    reason."""
    loaded = yaml.safe_load(known_file.read_text(encoding="utf-8"))
    assert isinstance(loaded, dict), f"{known_file.name} must be a mapping (use {{}} when empty)"
    assert len(loaded) <= most, f"{len(loaded)} known failures, at most {most}"
    for rel, reason in loaded.items():
        assert isinstance(rel, str), f"{rel!r}: the key must be a case path"
        prefix, _, inner = rel.partition("/") if "" not in roots else ("", "", rel)
        assert prefix in roots, f"{rel}: must start with one of {', '.join(roots)}"
        assert (roots[prefix] / inner).is_file(), f"{rel}: names no case under {roots[prefix]}"
        assert isinstance(reason, str), f"{rel}: the reason must be a string"
        assert reason.strip(), f"{rel}: empty reason"
        assert "\n" not in reason.strip(), f"{rel}: the reason must be one line"
