"""Specs for the binder's options (`services.binder.service.parse_options`): ``--set`` text read through
`shared.options.read_options` into `BinderOptions`, every default as it always was, and a bad option refused
naming the service, the option and the value, so the binder does not start."""

from __future__ import annotations

import pytest

from services.binder.service import BinderOptions, parse_options
from shared.errors import ConfigError


def test_every_option_has_the_default_it_always_had() -> None:
    assert parse_options({}) == BinderOptions(
        batch=16,
        fetch_timeout=1.0,
        cluster_timeout=2.0,
        cluster_attempts=5,
        recovery_grace=10.0,
        recovery_interval=2.0,
        keepalive=10.0,
        conflicts="revision",
        commit_timeout=8.0,
        cluster="nats",
        kubeconfig="",
        stop_grace=3.0,
        reservation_image="kairos",
        reservation_command="python -m services.gpu_agent.reservation",
        reservation_service_account="kairos-reservation",
        reservation_runtime_class="",
        reservation_timeout=60.0,
        reservation_attempts=3,
        reservation_sync=30.0,
        reservation_grace=5.0,
        volume_bind_timeout=120.0,
        bind_steps="volumebinding,dynamicresources,gpusharing",
        hami_core_enabled=False,
    )


def test_options_are_read_from_text() -> None:
    read = parse_options(
        {
            "batch": "4",
            "cluster_attempts": "1",
            "recovery_grace": "0",
            "stop_grace": "0",
            "conflicts": "fit",
            "cluster": "kube",
            "commit_timeout": "2.5",
            "hami_core_enabled": "true",
        }
    )
    assert (read.batch, read.cluster_attempts, read.recovery_grace, read.stop_grace) == (4, 1, 0.0, 0.0)
    assert (read.conflicts, read.cluster, read.commit_timeout, read.hami_core_enabled) == (
        "fit",
        "kube",
        2.5,
        True,
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"batch": "0"}, "option 'batch': expected a whole number >= 1, got '0'"),
        ({"cluster_attempts": "0"}, "option 'cluster_attempts': expected a whole number >= 1, got '0'"),
        ({"cluster_attempts": "-3"}, "option 'cluster_attempts': expected a whole number >= 1, got '-3'"),
        ({"fetch_timeout": "0"}, "option 'fetch_timeout': expected a number > 0.0, got '0'"),
        ({"cluster_timeout": "-1"}, "option 'cluster_timeout': expected a number > 0.0, got '-1'"),
        ({"recovery_interval": "0"}, "option 'recovery_interval': expected a number > 0.0, got '0'"),
        ({"keepalive": "inf"}, "option 'keepalive': expected a number <= 31536000.0, got 'inf'"),
        ({"commit_timeout": "soon"}, "option 'commit_timeout': expected a number, got 'soon'"),
        ({"recovery_grace": "-1"}, "option 'recovery_grace': expected a number >= 0.0, got '-1'"),
        ({"stop_grace": "-0.5"}, "option 'stop_grace': expected a number >= 0.0, got '-0.5'"),
        ({"cluster": "k8s"}, "option 'cluster': expected one of nats, kube, got 'k8s'"),
        ({"conflicts": "none"}, "option 'conflicts': expected one of revision, fit, got 'none'"),
        ({"reservation_image": ""}, "option 'reservation_image': expected text that is not blank, got ''"),
        ({"hami_core_enabled": "yes"}, "option 'hami_core_enabled': expected true or false, got 'yes'"),
    ],
)
def test_a_bad_option_is_refused_naming_the_service_the_option_and_the_value(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options(options)
    assert str(refused.value) == f"service binder: {message}"


def test_a_misspelt_option_is_refused_listing_the_known_ones() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options({"comit_timeout": "5"})
    assert str(refused.value).startswith(
        "service binder: unknown option 'comit_timeout' (known: batch, bind_steps, cluster, "
    )
