"""The exception tree drawn in shared/errors.py's docstring is the whole tree: every `KairosError` subclass
defined anywhere in Kairos appears in it, under its own parent, naming the module that defines it."""

from __future__ import annotations

import importlib
import pkgutil
import re

import services
import shared
import tools
from shared import errors
from shared.errors import KairosError

LINE = re.compile(r"^(?P<indent>[ |]*)(?:\+-- )?(?P<name>[A-Z]\w+)\s{2,}.*?(?:\((?P<module>[\w.]+)\))?$")


def _import_everything() -> None:
    for package in (shared, services, tools):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            importlib.import_module(module.name)


def _subclasses(cls: type[BaseException]) -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    for sub in cls.__subclasses__():
        found.append(sub)
        found.extend(_subclasses(sub))
    return found


def _drawn() -> dict[str, tuple[str | None, str | None]]:
    """Class name -> (its parent in the drawing, the module the drawing names)."""
    doc = errors.__doc__ or ""
    drawing = doc.split("::", 1)[1]
    parents: list[tuple[int, str]] = []
    drawn: dict[str, tuple[str | None, str | None]] = {}
    for raw in drawing.strip("\n").splitlines():
        match = LINE.match(raw.strip("\n")[4:])
        assert match, f"a line of the drawing does not read as a class: {raw!r}"
        depth = len(match["indent"]) // 4 + (1 if "+--" in raw else 0)
        while parents and parents[-1][0] >= depth:
            parents.pop()
        drawn[match["name"]] = (parents[-1][1] if parents else None, match["module"])
        parents.append((depth, match["name"]))
    return drawn


def test_every_kairos_error_is_drawn_under_its_parent_with_its_module() -> None:
    _import_everything()
    drawn = _drawn()
    classes = [KairosError, *_subclasses(KairosError)]
    missing = [c.__name__ for c in classes if c.__name__ not in drawn]
    assert not missing, f"not in shared/errors.py's tree: {missing}"
    for cls in classes:
        parent, module = drawn[cls.__name__]
        expected_parent = None if cls is KairosError else cls.__mro__[1].__name__
        assert parent == expected_parent, (
            f"{cls.__name__} is drawn under {parent}, defined under {expected_parent}"
        )
        if cls.__module__ != "shared.errors":
            assert module == cls.__module__, (
                f"{cls.__name__} is drawn in {module}, defined in {cls.__module__}"
            )


def test_the_drawing_names_no_class_that_does_not_exist() -> None:
    _import_everything()
    names = {c.__name__ for c in [KairosError, *_subclasses(KairosError)]}
    assert set(_drawn()) <= names
