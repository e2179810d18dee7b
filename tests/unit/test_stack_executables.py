"""Spec: a program Kairos starts (nats-server, py-spy) is found beside this interpreter first, then on
PATH, and a missing one is a ConfigError that says how to install it (`tools.stack.executables`)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from shared.errors import ConfigError
from tools.stack.executables import executable


def _program(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("beside", "on_path", "found"), [(True, True, "venv"), (False, True, "path"), (True, False, "venv")]
)
def test_the_program_beside_the_interpreter_comes_before_the_one_on_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, beside: bool, on_path: bool, found: str
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    (tmp_path / "venv").mkdir()
    if beside:
        _program(tmp_path / "venv", "tool")
    if on_path:
        _program(tmp_path / "path", "tool")
    assert executable("tool", "no tool") == str(tmp_path / found / "tool")


def test_a_program_found_nowhere_is_a_config_error_with_the_callers_words(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"^nats-server not found: install it$"):
        executable("nats-server", "nats-server not found: install it")


def test_a_folder_of_that_name_beside_the_interpreter_is_not_the_program(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path / "path"))
    (tmp_path / "venv" / "tool").mkdir(parents=True)
    _program(tmp_path / "path", "tool")
    assert executable("tool", "no tool") == str(tmp_path / "path" / "tool")
