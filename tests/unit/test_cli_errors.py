"""``kairos`` on bad input: one ``kairos: ...`` line on stderr, exit code 2, never a traceback."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
import yaml

from tools.cli.main import main
from tools.conformance import corpus_dir
from tools.conformance.result import decode_result

if TYPE_CHECKING:
    from pathlib import Path

# A real case whose first node declares -4 GPUs.
VALID_CASE = next(corpus_dir().glob("consolidation_and_reclaim/*.yaml"))
INVALID_CASE = VALID_CASE.read_text().replace("{name: node0, gpus: 4,", "{name: node0, gpus: -4,", 1)


def _one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("kairos: ")
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def invalid_case(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(INVALID_CASE)
    return path


@pytest.mark.parametrize("extra", [[], ["--json"], ["--via-bus"]])
def test_run_invalid_case(invalid_case: Path, capsys: pytest.CaptureFixture[str], extra: list[str]) -> None:
    assert main(["conformance", "run", str(invalid_case), *extra]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert line == f"kairos: case {str(invalid_case)!r}: nodes[0].gpus: negative quantity -4 (node 'node0')"
    assert captured.out == ""


def test_run_yaml_syntax_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("name: [oops\n  family: {\n")
    assert main(["conformance", "run", str(path), "--json"]) == 2
    assert "invalid YAML" in _one_error_line(capsys.readouterr().err)


def test_run_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "absent.yaml"
    assert main(["conformance", "run", str(missing)]) == 2
    line = _one_error_line(capsys.readouterr().err)
    assert str(missing) in line
    assert "No such file" in line


def test_run_directory_instead_of_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "run", str(tmp_path)]) == 2
    _one_error_line(capsys.readouterr().err)


def test_check_missing_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "check", str(tmp_path / "nowhere")]) == 2
    _one_error_line(capsys.readouterr().err)


def test_check_counts_an_invalid_case_as_failed(
    invalid_case: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["conformance", "check", str(invalid_case.parent)]) == 1
    captured = capsys.readouterr()
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert lines[0] == "FAIL bad.yaml: invalid case: nodes[0].gpus: negative quantity -4 (node 'node0')"
    assert lines[-1] == "0 passed, 1 failed"


def test_check_empty_folder_passes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "check", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "0 passed, 0 failed\n"


@pytest.mark.parametrize("argv", [[], ["conformance"], ["conformance", "run"], ["nonsense"]])
def test_usage_errors_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    assert "conformance" in capsys.readouterr().out


# A single-session case whose scheduler conf Kairos runs (a tier of one plugin: the registry leaves the rest
# out), and the same case with a per-extension-point switch Kairos has no equivalent for.
CONF_CASE = next(corpus_dir("actions-config").glob("allocate/allocate__017__*.yaml"))


def _refused_conf_case(tmp_path: Path) -> Path:
    case = yaml.safe_load(CONF_CASE.read_text())
    case["harness"]["scheduler_conf"]["tiers"][0]["plugins"][0]["disableJobPipelined"] = True
    path = tmp_path / CONF_CASE.name
    path.write_text(yaml.safe_dump(case, sort_keys=False))
    return path


def test_run_runs_a_scheduler_conf_of_one_plugin(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["conformance", "run", str(CONF_CASE)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "PASS"


@pytest.mark.parametrize("extra", [["--json"], ["--via-bus"]])
def test_run_refuses_a_scheduler_conf_the_policy_cannot_express(
    capsys: pytest.CaptureFixture[str], extra: list[str], tmp_path: Path
) -> None:
    assert main(["conformance", "run", str(_refused_conf_case(tmp_path)), *extra]) == 2
    captured = capsys.readouterr()
    line = _one_error_line(captured.err)
    assert "harness.scheduler_conf.tiers[0].plugins[0].disableJobPipelined" in line
    assert captured.out == ""


def test_run_prints_one_round_and_one_checkpoint_for_a_single_session_case(
    capsys: pytest.CaptureFixture[str],
) -> None:
    path = next(corpus_dir("actions").glob("reclaim/reclaim__000__*.yaml"))
    assert main(["conformance", "run", str(path), "--json"]) == 0
    result = decode_result(capsys.readouterr().out)
    assert (len(result.rounds), len(result.checkpoints)) == (1, 1)
    assert main(["conformance", "run", str(path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[1].startswith("rounds: 1 (single session: reclaim); ")
    assert out[-1] == "PASS"


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--nats-cluster", "2"], "--nats-cluster: 1 (one server) or at least 3 servers, got 2"),
        (["--nats-cluster", "3", "--port", "4222"], "--nats-cluster with --port"),
    ],
)
def test_up_refuses_a_nats_cluster_it_cannot_run(
    argv: list[str], names: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["up", "--memory", "--state-dir", str(tmp_path / "k"), *argv]) == 2
    assert names in _one_error_line(capsys.readouterr().err)
    assert not (tmp_path / "k").exists()  # refused before anything started
