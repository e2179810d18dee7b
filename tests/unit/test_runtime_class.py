"""The runtime class KAI's admission gives fractional GPU pods (``runtimeenforcement``, scoped to fractional
pods since KAI v0.16): Kairos's webhook adds ``spec.runtimeClassName`` to a fractional pod that names none,
leaves every other pod and any class a pod names alone, and the state option `gpu_fraction_runtime_class_name`
(KAI's ``--gpu-fraction-runtime-class-name``, default ``nvidia``; empty turns it off) names the class."""

from __future__ import annotations

from typing import Any

import pytest

from services.state.service import StateOptions
from services.state.webhook.admission_review import request_of
from services.state.webhook.webhook import DEFAULT_RUNTIME_CLASS, WebhookOptions, runtime_class_patch
from shared.errors import ConfigError
from shared.kube import keys, wire
from tests.builders import pod_manifest


def pod(annotations: dict[str, str] | None = None, **fields: Any) -> dict[str, Any]:
    """The pod `team-a/p` with `annotations`; `fields` as for `pod_manifest` (``limits=``, spec fields)."""
    return pod_manifest("p", "team-a", annotations=annotations, **fields)


SET = [{"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}]


@pytest.mark.parametrize(
    ("obj", "runtime_class", "expected"),
    [
        pytest.param(pod({keys.GPU_FRACTION: "0.5"}), "nvidia", SET, id="a gpu-fraction pod gets the class"),
        pytest.param(pod({keys.GPU_MEMORY: "4096"}), "nvidia", SET, id="a gpu-memory pod gets the class"),
        pytest.param(
            pod({keys.GPU_FRACTION: "0.5"}),
            "kata-nvidia",
            [{"op": "add", "path": "/spec/runtimeClassName", "value": "kata-nvidia"}],
            id="the switch names the class",
        ),
        pytest.param(
            pod(limits={keys.NVIDIA_GPU: "1"}),
            "nvidia",
            [],
            id="a whole-GPU pod is left alone (since KAI v0.16)",
        ),
        pytest.param(pod(), "nvidia", [], id="a pod without a GPU is left alone"),
        pytest.param(
            pod({keys.GPU_FRACTION: "0.5"}, runtimeClassName="custom-runtime"),
            "nvidia",
            [],
            id="a class the pod names is never replaced",
        ),
        pytest.param(
            pod({keys.GPU_FRACTION: "0.5"}, runtimeClassName=""),
            "nvidia",
            SET,
            id="an empty class name counts as none",
        ),
        pytest.param(pod({keys.GPU_FRACTION: "0.5"}), "", [], id="an empty switch turns the injection off"),
    ],
)
def test_the_runtime_class_of_a_pod_being_created(
    obj: dict[str, Any], runtime_class: str, expected: list[dict[str, Any]]
) -> None:
    request = request_of("r-1", "CREATE", "team", obj=obj)
    assert runtime_class_patch(wire.convert(wire.Pod, obj), request, runtime_class) == expected


def test_kais_default_is_nvidia_and_the_webhook_uses_it() -> None:
    assert DEFAULT_RUNTIME_CLASS == "nvidia"
    assert WebhookOptions(port=0).fraction_runtime_class == "nvidia"
    assert StateOptions.parse({"source": "kube"}).gpu_fraction_runtime_class_name == "nvidia"


@pytest.mark.parametrize(
    ("given_options", "expected"),
    [
        ({"gpu_fraction_runtime_class_name": "kata-nvidia"}, "kata-nvidia"),
        ({"gpu_fraction_runtime_class_name": ""}, ""),
        ({"gpu_pod_runtime_class_name": "legacy"}, "legacy"),
        ({"gpu_pod_runtime_class_name": ""}, ""),
        ({"gpu_fraction_runtime_class_name": "new", "gpu_pod_runtime_class_name": "legacy"}, "new"),
    ],
    ids=[
        "the switch names the class",
        "empty turns it off",
        "KAI's deprecated name is read when the new one is not given",
        "the deprecated name turns it off too",
        "the new name wins over the deprecated one",
    ],
)
def test_the_switch_and_its_deprecated_name(given_options: dict[str, str], expected: str) -> None:
    options = StateOptions.parse({"source": "kube", "webhook_port": "8443", **given_options})
    assert options.gpu_fraction_runtime_class_name == expected


@pytest.mark.parametrize("key", ["gpu_fraction_runtime_class_name", "gpu_pod_runtime_class_name"])
def test_a_runtime_class_that_is_no_name_is_refused_naming_the_option(key: str) -> None:
    with pytest.raises(ConfigError, match=f"option '{key}': expected a RuntimeClass name"):
        StateOptions.parse({"source": "kube", key: "Not A Name"})
