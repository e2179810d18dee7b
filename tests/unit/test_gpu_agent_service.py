"""The GPU agent's settings and command line: the node name, the period, `--allow-no-gpu`, and the exit codes
of `run()` before it ever connects to NATS (bad settings: 2; no NVML without the flag: 1, one line)."""

from __future__ import annotations

import re

import pynvml
import pytest

from services.gpu_agent.service import SWITCHES, AgentSettings, run
from shared.bus.service import parse_config
from shared.errors import ConfigError
from tests.unit.test_gpu_agent_fake_nvml import FakeNvml


def settings(*argv: str, environ: dict[str, str] | None = None) -> AgentSettings:
    config = parse_config("gpu_agent", list(argv), SWITCHES)
    return AgentSettings.from_options(config.options, environ or {})


def test_the_node_name_defaults_to_the_node_name_environment_variable() -> None:
    assert settings(environ={"NODE_NAME": "gpu-7"}).node == "gpu-7"


def test_the_node_option_wins_over_the_environment() -> None:
    assert settings("--set", "node=gpu-1", environ={"NODE_NAME": "gpu-7"}).node == "gpu-1"


def test_a_missing_node_name_is_a_config_error_naming_the_option() -> None:
    with pytest.raises(
        ConfigError,
        match=r"^service gpu_agent: option 'node': missing; pass --set node=NAME or set NODE_NAME",
    ):
        settings()


def test_an_empty_node_name_is_missing_too() -> None:
    with pytest.raises(ConfigError, match="option 'node'"):
        settings("--set", "node=", environ={"NODE_NAME": "gpu-7"})


def test_the_period_defaults_to_thirty_seconds_and_takes_seconds() -> None:
    assert settings("--set", "node=n").period == 30.0
    assert settings("--set", "node=n", "--set", "period=2.5").period == 2.5


@pytest.mark.parametrize(
    ("period", "expected"),
    [
        ("0", "expected a number > 0.0, got '0'"),
        ("-1", "expected a number > 0.0, got '-1'"),
        ("nan", "expected a number > 0.0, got 'nan'"),
        ("inf", "expected a number <= 600.0, got 'inf'"),
        ("601", "expected a number <= 600.0, got '601'"),
    ],
)
def test_a_period_that_is_not_positive_seconds_is_a_config_error_naming_it(
    period: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match=f"^service gpu_agent: option 'period': {re.escape(expected)}$"):
        settings("--set", "node=n", "--set", f"period={period}")


def test_a_period_that_is_not_a_number_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match=r"period"):
        settings("--set", "node=n", "--set", "period=soon")


def test_an_unknown_option_is_a_config_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="colour"):
        settings("--set", "node=n", "--set", "colour=green")


def test_allow_no_gpu_is_off_unless_asked() -> None:
    assert not settings("--set", "node=n").allow_no_gpu


@pytest.mark.parametrize("argv", [["--allow-no-gpu"], ["--set", "allow_no_gpu=true"]])
def test_allow_no_gpu_is_a_flag_or_an_option(argv: list[str]) -> None:
    assert settings("--set", "node=n", *argv).allow_no_gpu


def test_without_nvml_the_agent_exits_1_with_one_line_naming_nvmls_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    code = run(["--set", "node=n"], nvml=FakeNvml(init_error=pynvml.NVMLError_LibraryNotFound))
    err = capsys.readouterr().err
    assert code == 1
    assert err.count("\n") == 1
    assert err.startswith("kairos gpu_agent: no usable NVIDIA driver/NVML on this machine: ")
    assert "NVMLError_LibraryNotFound" in err


def test_bad_settings_exit_2_before_nvml_is_touched(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeNvml()
    code = run(["--set", "node=n", "--set", "period=-3"], nvml=fake)
    assert code == 2
    assert capsys.readouterr().err.startswith("kairos: service gpu_agent: option 'period'")
    assert fake.initialised == 0
