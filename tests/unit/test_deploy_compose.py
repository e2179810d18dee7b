"""docker-compose.yml and the Dockerfile, read as specifications: the containers the local setup runs,
how each Kairos service is started and wired (NATS, the simulated API server's kubeconfig, traces), and an
image that runs as a non-root user with no development tools. `docker compose config` itself runs when a
compose tool is installed (the Compose file must also pass docker-compose 1.29's schema)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("state", "queue", "placement", "binder")


def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def service(name: str) -> dict[str, Any]:
    found: dict[str, Any] = compose()["services"][name]
    return found


def test_compose_runs_the_infrastructure_and_the_four_services() -> None:
    assert set(compose()["services"]) == {"nats", "jaeger", "kubesim", *SERVICES}


def test_nats_runs_with_jetstream_and_reports_its_health() -> None:
    nats = service("nats")
    assert "-js" in nats["command"]
    assert "js-enabled-only" in " ".join(nats["healthcheck"]["test"])


def test_jaeger_serves_its_ui_and_takes_otlp_over_http() -> None:
    assert {"16686:16686", "4318:4318"} <= {p.split(" ")[0] for p in service("jaeger")["ports"]}


def test_kubesim_serves_the_api_with_kai_s_crds_and_shares_its_kubeconfig() -> None:
    kubesim = service("kubesim")
    argv = [*kubesim["entrypoint"], *kubesim["command"]]
    assert argv == [
        *("python", "-m", "tools.kubesim", "--host", "0.0.0.0", "--port", "6443"),
        *("--crds", "deploy/crds", "--kubeconfig-out", "/shared/kubeconfig"),
    ]
    assert "kube:/shared" in kubesim["volumes"]


@pytest.mark.parametrize("name", SERVICES)
def test_each_service_runs_kairos_serve_against_nats_with_a_readiness_check(name: str) -> None:
    spec = service(name)
    assert spec["command"][:2] == ["serve", name]
    assert spec["image"] == "kairos:dev"
    env = spec["environment"]
    assert env["KAIROS_NATS_URL"] == "nats://nats:4222"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"
    assert env["OTEL_SERVICE_NAME"] == f"kairos-{name}"
    assert spec["depends_on"]["nats"] == {"condition": "service_healthy"}
    assert f"127.0.0.1:{env['KAIROS_HEALTH_PORT']}/readyz" in " ".join(spec["healthcheck"]["test"])
    assert spec["read_only"] is True
    assert spec["cap_drop"] == ["ALL"]


@pytest.mark.parametrize("name", ["state", "binder"])
def test_the_services_that_call_the_api_read_kubesim_s_kubeconfig_once_written(name: str) -> None:
    spec = service(name)
    assert spec["environment"]["KUBECONFIG"] == "/shared/kubeconfig"
    assert "kube:/shared:ro" in spec["volumes"]
    assert spec["depends_on"]["kubesim"] == {"condition": "service_healthy"}


def test_the_state_service_reads_the_cluster_from_the_api_and_the_binder_binds_there() -> None:
    assert service("state")["environment"]["KAIROS_SOURCE"] == "kube"
    assert service("binder")["command"] == ["serve", "binder", "--set", "cluster=kube"]


def compose_tool() -> list[str] | None:
    docker = shutil.which("docker")
    if (
        docker
        and subprocess.run([docker, "compose", "version"], capture_output=True, check=False).returncode == 0
    ):
        return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy else None


def test_docker_compose_accepts_the_file() -> None:
    tool = compose_tool()
    if tool is None:
        pytest.skip("no docker compose or docker-compose installed")
    result = subprocess.run(
        [*tool, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr


# --- the image ----------------------------------------------------------------------------------------------
def dockerfile() -> list[str]:
    return [line.strip() for line in (ROOT / "Dockerfile").read_text().splitlines() if line.strip()]


def instructions(keyword: str) -> list[str]:
    return [line.split(" ", 1)[1] for line in dockerfile() if line.split(" ", 1)[0] == keyword]


def test_the_image_is_slim_python_3_11() -> None:
    assert instructions("FROM") == ["python:3.11-slim"]


def test_the_image_runs_kairos_as_a_non_root_user() -> None:
    users = instructions("USER")
    assert users == ["10001:10001"]
    assert instructions("ENTRYPOINT") == ['["kairos"]']


def test_the_image_installs_the_package_without_development_tools() -> None:
    runs = " ".join(instructions("RUN"))
    assert "pip install . " in runs + " "
    assert "[dev]" not in runs


def test_the_image_carries_the_crds_kubesim_loads() -> None:
    assert "deploy/crds /opt/kairos/deploy/crds" in instructions("COPY")
    assert instructions("WORKDIR")[-1] == "/opt/kairos"
