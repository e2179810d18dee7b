"""The pod-grouper's switches as state-service options, named after KAI's pod-grouper flags: their defaults
are KAI's, a bad value is refused naming the option, and they reach the pod-grouper's settings."""

from __future__ import annotations

import pytest

from services.state.controllers.grouping import GrouperConfig
from services.state.service import StateOptions
from services.state.sources.kube_source import KubeSourceOptions
from shared.errors import ConfigError


def test_the_defaults_are_kais() -> None:
    config = StateOptions.parse({"source": "kube"}).grouper_config()
    assert (config.search_legacy_podgroups, config.knative_gang_schedule) == (True, True)
    assert (config.defaults_configmap, config.defaults_configmap_namespace) == ("", "")
    assert config.scheduler_name == "kai-scheduler"


def test_each_switch_reaches_the_pod_grouper() -> None:
    options = StateOptions.parse(
        {
            "source": "kube",
            "search_legacy_pg": "false",
            "knative_gang_schedule": "false",
            "default_priorities_configmap_name": "kai-defaults",
            "default_priorities_configmap_namespace": "kai-system",
            "scheduler_name": "other",
        }
    )
    assert options.grouper_config() == GrouperConfig(
        scheduler_name="other",
        search_legacy_podgroups=False,
        knative_gang_schedule=False,
        defaults_configmap="kai-defaults",
        defaults_configmap_namespace="kai-system",
    )


def test_the_defaults_configmap_is_looked_for_in_the_services_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "kairos-system")
    config = StateOptions.parse({"source": "kube", "default_priorities_configmap_name": "d"}).grouper_config()
    assert (config.defaults_configmap, config.defaults_configmap_namespace) == ("d", "kairos-system")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("search_legacy_pg", "maybe"),
        ("knative_gang_schedule", "2"),
        ("default_priorities_configmap_name", "Not A Name"),
        ("default_priorities_configmap_namespace", "kai_system"),
    ],
)
def test_a_bad_switch_is_refused_naming_the_option(key: str, value: str) -> None:
    options = {"source": "kube", "default_priorities_configmap_name": "d", key: value}
    with pytest.raises(ConfigError, match=f"option '{key}'"):
        StateOptions.parse(options)


def test_the_kubernetes_source_hands_the_settings_to_its_pod_grouper() -> None:
    config = GrouperConfig(knative_gang_schedule=False)
    assert KubeSourceOptions(grouper=config).grouper_config() is config
    assert KubeSourceOptions(scheduler_name="s").grouper_config() == GrouperConfig(scheduler_name="s")
