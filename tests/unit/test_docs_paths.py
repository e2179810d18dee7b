"""The docs name only what exists: every repository path in backticks (`services/binder/steps.py`,
`deploy/monitoring`) is a file or folder of the tree, and every dotted name of the runtime or the tools
(`shared.core.bind_backoff`, `shared.bus.fence.WriteFence`, `services/state/mirror/object_mirror.ObjectMirror`) is a
module, and the name after the module is defined in it. A module renamed or removed without its docs fails
here, naming the page and the stale name.

Paths with a placeholder (`<name>`, `*`, `{a,b}`) are patterns, not names, and are not checked.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "deploy" / "README.md",
        *(ROOT / "docs").glob("*.md"),
        *(ROOT / "tests").glob("*/README.md"),
    }
)
PATH = re.compile(r"`((?:shared|services|tools|tests|deploy|examples|docs|\.ci)/[A-Za-z0-9_./<>*{}-]*)`")
DOTTED = re.compile(r"`((?:shared|services|tools)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`")
PLACEHOLDER = re.compile(r"[<>*{}]")


def module_file(parts: list[str]) -> tuple[Path, list[str]] | None:
    """The longest prefix of `parts` that is a module (its file) and the names after it."""
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate, parts[i:]
    return None


def defines(source: str, name: str) -> bool:
    """Whether a module's text defines `name` (a def, class, assignment or annotation, an import, or an
    attribute of a class at any indentation)."""
    return bool(
        re.search(
            rf"^\s*(?:async\s+def|def|class)\s+{re.escape(name)}\b"
            rf"|^\s*{re.escape(name)}\s*[:=]"
            rf"|^\s*(?:from\s+\S+\s+)?import\b.*\b{re.escape(name)}\b",
            source,
            re.MULTILINE,
        )
    )


def stale_names(text: str) -> list[str]:
    stale: list[str] = []
    for match in PATH.finditer(text):
        path = match.group(1).rstrip("/.")
        if PLACEHOLDER.search(path) or (ROOT / path).exists():
            continue
        # `services/state/mirror/object_mirror.ObjectMirror`: a module's path, then a name defined in it.
        head, _, name = path.rpartition(".")
        if name and (ROOT / f"{head}.py").is_file() and defines((ROOT / f"{head}.py").read_text(), name):
            continue
        stale.append(path)
    for match in DOTTED.finditer(text):
        found = module_file(match.group(1).split("."))
        if found is None:
            stale.append(match.group(1))
            continue
        source, rest = found
        if rest and not defines(source.read_text(encoding="utf-8"), rest[0]):
            stale.append(match.group(1))
    return stale


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_path_and_module_a_page_names_exists(page: Path) -> None:
    assert stale_names(page.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("text", "stale"),
    [
        ("`services/binder/steps.py` and `deploy/monitoring`", []),
        ("`services/binder/no_such_step.py`", ["services/binder/no_such_step.py"]),
        ("`shared.core.bind_backoff`, `shared.bus.fence.WriteFence`", []),
        ("`shared.core.no_such_module`", ["shared.core.no_such_module"]),
        ("`shared.bus.fence.NoSuchThing`", ["shared.bus.fence.NoSuchThing"]),
        ("`services/state/mirror/object_mirror.ObjectMirror`", []),
        (
            "`services/state/mirror/object_mirror.NoSuchMirror`",
            ["services/state/mirror/object_mirror.NoSuchMirror"],
        ),
        ("`services/<name>/service.py`, `tests/unit/test_*.py`", []),
    ],
)
def test_the_check_tells_a_stale_name_from_a_live_one(text: str, stale: list[str]) -> None:
    assert stale_names(text) == stale
