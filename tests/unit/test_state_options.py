"""Specs for the state service's options (`services.state.service.StateOptions.parse`): ``--set`` text over
env ``KAIROS_<KEY>``, read through `shared.options.read_options`, with the defaults they always had; an
option given empty takes its default unless its empty text means something; a bad or misspelt option is
refused naming the service, the option and the value, so the service does not start."""

from __future__ import annotations

import pytest

from services.state.controllers.scaling_pods import ScaleAdjustOptions
from services.state.service import StateOptions
from shared.errors import ConfigError
from tests.unit import test_deploy_manifests as deploy

NO_ENV: dict[str, str] = {}


def parse(options: dict[str, str], environ: dict[str, str] | None = None) -> StateOptions:
    return StateOptions.parse(options, environ=NO_ENV if environ is None else environ)


def test_every_option_has_the_default_it_always_had() -> None:
    read = parse({})
    assert (read.source, read.cluster, read.demo, read.run_delay, read.snapshot_wait) == (
        "sim",
        None,
        False,
        0.0,
        5.0,
    )
    assert (read.kubeconfig, read.scheduler_name, read.webhook_port, read.webhook_cert, read.webhook_key) == (
        None,
        "kai-scheduler",
        0,
        None,
        None,
    )
    assert (read.quota_gate, read.queue_quota_validation, read.block_nvidia_visible_devices) == (False,) * 3
    assert (read.hami_core_enabled, read.node_pool_label_key) == (False, "kai.scheduler/node-pool")
    assert read.gpu_fraction_runtime_class_name == "nvidia"
    assert read.scale_adjust == ScaleAdjustOptions()
    assert (read.search_legacy_podgroups, read.knative_gang_schedule) == (True, True)
    assert (read.defaults_configmap, read.defaults_configmap_namespace, read.partitions) == ("", "", 0)


def test_an_option_not_given_is_read_from_its_environment_variable_and_set_wins() -> None:
    environ = {"KAIROS_SOURCE": "kube", "KAIROS_RUN_DELAY": "2", "KAIROS_SEARCH_LEGACY_PG": "false"}
    read = parse({"run_delay": "3"}, environ)
    assert (read.source, read.run_delay, read.search_legacy_podgroups) == ("kube", 3.0, False)


def test_an_environment_variable_that_names_no_option_is_not_read() -> None:
    assert parse({}, {"KAIROS_SORCE": "kube", "KAIROS_LOG_LEVEL": "DEBUG"}).source == "sim"


def test_the_kubeconfig_and_the_defaults_namespace_come_from_the_pods_environment() -> None:
    environ = {"KUBECONFIG": "/etc/kube.yaml", "POD_NAMESPACE": "kairos-system"}
    read = parse({"source": "kube", "default_priorities_configmap_name": "d"}, environ)
    assert (read.kubeconfig, read.defaults_configmap, read.defaults_configmap_namespace) == (
        "/etc/kube.yaml",
        "d",
        "kairos-system",
    )
    assert parse(
        {"source": "kube", "default_priorities_configmap_name": "d"}
    ).defaults_configmap_namespace == ("kai-scheduler")
    assert parse({"kubeconfig": "/mine"}, environ).kubeconfig == "/mine"


@pytest.mark.parametrize(
    "option",
    ["source", "run_delay", "snapshot_wait", "webhook_port", "demo", "scheduler_name", "scaling_pod_image"],
)
def test_an_option_given_empty_takes_its_default(option: str) -> None:
    assert parse({option: ""}) == parse({})
    assert parse({option: "  "}) == parse({})


@pytest.mark.parametrize(
    "option",
    [
        "node_pool_label_key",
        "gpu_fraction_runtime_class_name",
        "scaling_pod_service_account",
        "scaling_pod_app_label",
    ],
)
def test_an_option_whose_empty_text_means_something_keeps_it(option: str) -> None:
    assert getattr(parse({"source": "kube", option: " "}), option) == ""


def test_text_is_read_without_the_spaces_around_it() -> None:
    read = parse({"source": "kube", "webhook_port": " 9443 ", "node_pool_label_key": " pool "})
    assert (read.webhook_port, read.node_pool_label_key) == (9443, "pool")


@pytest.mark.parametrize(("text", "on"), [("true", True), ("True", True), ("1", True), ("false", False)])
def test_a_switch_reads_the_projects_boolean_words(text: str, on: bool) -> None:
    assert parse({"demo": text}).demo is on


def test_partitions_are_kept_only_by_the_kubernetes_source() -> None:
    assert parse({"source": "kube", "partitions": "4"}).partitions == 4
    assert parse({"source": "none", "partitions": "4"}).partitions == 0


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"source": "k8s"}, "option 'source': expected one of sim, kube, none, got 'k8s'"),
        ({"run_delay": "soon"}, "option 'run_delay': expected a number, got 'soon'"),
        ({"snapshot_wait": "-1"}, "option 'snapshot_wait': expected a number >= 0.0, got '-1'"),
        ({"demo": "yes"}, "option 'demo': expected true or false, got 'yes'"),
        ({"webhook_port": "70000"}, "option 'webhook_port': expected a port 0-65535, got '70000'"),
        ({"partitions": "2.5"}, "option 'partitions': expected 0 (off) or a count up to 1024, got '2.5'"),
        (
            {"source": "kube", "scale_adjust_namespace": "Kai_System"},
            "option 'scale_adjust_namespace': expected a namespace name, got 'Kai_System'",
        ),
        (
            {"source": "kube", "gpu_memory_to_fraction_ratio": "1.5"},
            "option 'gpu_memory_to_fraction_ratio': expected a share of a GPU in (0, 1], got '1.5'",
        ),
        (
            {"source": "kube", "search_legacy_pg": "maybe"},
            "option 'search_legacy_pg': expected true or false, got 'maybe'",
        ),
        (
            {"source": "kube", "default_priorities_configmap_name": "Not A Name"},
            "option 'default_priorities_configmap_name': expected a ConfigMap name, got 'Not A Name'",
        ),
        ({"webhook_cert": "c.pem"}, "options 'webhook_cert' and 'webhook_key': give both or neither"),
        (
            {"source": "kube", "quota_gate": "true"},
            "option 'quota_gate': needs 'webhook_port' and source kube or none (the admission webhook does it)",
        ),
    ],
)
def test_a_bad_option_is_refused_naming_the_service_the_option_and_the_value(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse(options)
    assert str(refused.value) == f"service state: {message}"


def test_a_bad_value_from_the_environment_is_refused_naming_the_option() -> None:
    with pytest.raises(ConfigError, match="option 'source': expected one of sim, kube, none, got 'k8s'"):
        parse({}, {"KAIROS_SOURCE": "k8s"})


def test_a_misspelt_option_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as refused:
        parse({"sorce": "kube"})
    assert str(refused.value).startswith(
        "service state: unknown option 'sorce' (known: block_nvidia_visible_devices,"
    )
    assert "search_legacy_pg" in str(refused.value)


def test_the_state_deployment_in_deploy_base_reads_as_options() -> None:
    objects = deploy.base()
    state = deploy.find(objects, "Deployment", "kairos-state")
    environ = {
        **deploy.config_map_data(objects, "kairos-env"),
        **{name: item["value"] for name, item in deploy.env_of(state).items() if "value" in item},
    }
    read = parse(deploy.set_options(state), environ)
    assert (read.source, read.webhook_port, read.scheduler_name) == ("kube", 9443, "kai-scheduler")
    assert (read.webhook_cert, read.webhook_key) == (
        "/etc/kairos/webhook/tls.crt",
        "/etc/kairos/webhook/tls.key",
    )
