"""The binder's GPU-sharing decisions as values (`services.binder.gpu_sharing_plan`) and its `reservation_*` options:
a sharer's patch, the share of each device, the capabilities ConfigMap's data, what a sync repairs, the
Events' words."""

from __future__ import annotations

from typing import Any

import pytest

from services.binder import gpu_sharing_plan
from services.binder.service import parse_options
from shared.errors import ConfigError
from shared.kube import gpu_sharing as gs
from shared.kube import wire


def pod(
    name: str = "a",
    *,
    node: str = "n0",
    phase: str = "Running",
    groups: str | None = "g1",
    prefix: str | None = "a-abc2def-shared-gpu",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> wire.Pod:
    annotations = {"gpu-fraction": "0.5"}
    if groups is not None:
        annotations["kairos.io/gpu-groups"] = groups
    if prefix is not None:
        annotations[gs.CONFIGMAP_ANNOTATION] = prefix
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "default",
        "uid": f"uid-{name}",
        "labels": {gs.SHARING_LABEL: "true", **(labels or {})},
        "annotations": annotations,
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return wire.convert(
        wire.Pod,
        {
            "metadata": meta,
            "spec": {"nodeName": node, "containers": [{"name": "main"}]},
            "status": {"phase": phase},
        },
    )


def reservation(node: str, group: str, device: str | None = "GPU-1") -> wire.Pod:
    body = gs.reservation_pod(node, group, image="kairos")
    if device is not None:
        body["metadata"]["annotations"][gs.RESERVED_DEVICE_ANNOTATION] = device
    return wire.convert(wire.Pod, body)


# --- a sharer's patch ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("before", "groups", "labels"),
    [
        ({}, ["g1"], {"runai-gpu-group": "g1", gs.SHARING_LABEL: "true"}),
        (
            {},
            ["g1", "g2"],
            {"runai-gpu-group/g1": "g1", "runai-gpu-group/g2": "g2", gs.SHARING_LABEL: "true"},
        ),
        # An earlier placement's group labels go, or the sync would keep that group's reservation alive.
        (
            {"runai-gpu-group/old": "old", "team": "x"},
            ["g1"],
            {"runai-gpu-group": "g1", "runai-gpu-group/old": None, gs.SHARING_LABEL: "true"},
        ),
        (
            {"runai-gpu-group": "old"},
            ["g1", "g2"],
            {
                "runai-gpu-group": None,
                "runai-gpu-group/g1": "g1",
                "runai-gpu-group/g2": "g2",
                gs.SHARING_LABEL: "true",
            },
        ),
    ],
    ids=["one device", "two devices", "stale multi label", "stale single label"],
)
def test_a_sharer_is_labelled_and_annotated_in_one_patch(
    before: dict[str, str], groups: list[str], labels: dict[str, Any]
) -> None:
    patch = gpu_sharing_plan.sharer_patch(before, groups)
    assert patch == {
        "metadata": {"labels": labels, "annotations": {"kairos.io/gpu-groups": ",".join(groups)}}
    }


def test_a_sharers_groups_come_from_the_binders_annotation_else_from_kais_labels() -> None:
    assert gpu_sharing_plan.groups_of_sharer(pod(groups="g2,g1").metadata) == ["g2", "g1"]
    labelled = pod(groups=None, labels={"runai-gpu-group": "g9"})
    assert gpu_sharing_plan.groups_of_sharer(labelled.metadata) == ["g9"]


def test_touching_a_reservation_names_the_sharer_and_the_time() -> None:
    assert gpu_sharing_plan.touch_patch("default/a", 12.5) == {
        "metadata": {"annotations": {"kairos.io/last-sharer": "default/a@12.500000"}}
    }


# --- the share and the data ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("gpus", "devices", "share"),
    [(0.5, 1, 0.5), (1.0, 2, 0.5), (0.75, 3, 0.25), (0.0, 1, None), (0.5, 0, None)],
)
def test_the_share_of_each_device_is_the_bindings_gpus_over_its_devices(
    gpus: float, devices: int, share: float | None
) -> None:
    assert gpu_sharing_plan.share_per_device(gpus, devices) == share


@pytest.mark.parametrize(
    ("annotations", "memory", "share"),
    [
        ({"gpu-fraction": "0.3"}, None, 0.3),
        ({"gpu-memory": "4000"}, 16_000, 0.25),
        ({"gpu-memory": "4001"}, 16_000, 0.26),  # rounded up to hundredths, as the core rounds
        ({"gpu-memory": "40000"}, 16_000, 1.0),
        ({"gpu-memory": "4000"}, None, None),  # the node's device memory unknown
        ({"gpu-fraction": "abc"}, None, None),
        ({"gpu-fraction": "1.5"}, None, None),
        ({}, 16_000, None),
    ],
)
def test_without_it_the_pods_annotations_give_the_share(
    annotations: dict[str, str], memory: int | None, share: float | None
) -> None:
    assert gpu_sharing_plan.share_from_annotations(annotations, memory) == share


def test_the_capabilities_configmap_names_the_devices_in_group_order_and_the_portion() -> None:
    assert gpu_sharing_plan.capabilities_data(["GPU-b", "GPU-a"], 0.5) == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-a",
        "GPU_PORTION": "0.50",
        "RUNAI_NUM_OF_GPUS": "0.50",
    }


# --- what the sync repairs -------------------------------------------------------------------------------------
CAPABILITIES = ("default", "a-abc2def-shared-gpu-0")
DIRECT_ENV = ("default", "a-abc2def-shared-gpu-0-evar")


def test_a_bound_sharer_with_everything_in_place_needs_no_repair() -> None:
    plan = gpu_sharing_plan.plan_repairs([pod()], [reservation("n0", "g1")], {CAPABILITIES, DIRECT_ENV})
    assert plan.reservations == {}
    assert plan.configmaps == []
    assert plan.devices == {("n0", "g1"): "GPU-1"}
    assert [s.name for s in plan.sharers] == ["default/a"]


def test_missing_reservations_are_grouped_by_node_and_group_with_their_sharers() -> None:
    sharers = [pod("a"), pod("b", prefix=None), pod("c", groups="g1,g2")]
    plan = gpu_sharing_plan.plan_repairs(sharers, [reservation("n0", "g2")], {CAPABILITIES, DIRECT_ENV})
    assert {key: [s.name for s in members] for key, members in plan.reservations.items()} == {
        ("n0", "g1"): ["default/a", "default/b", "default/c"]
    }
    assert plan.devices == {("n0", "g2"): "GPU-1"}


def test_missing_configmaps_are_named() -> None:
    plan = gpu_sharing_plan.plan_repairs([pod()], [reservation("n0", "g1")], {CAPABILITIES})
    assert [(m.sharer.name, m.name, m.capabilities) for m in plan.configmaps] == [
        ("default/a", "a-abc2def-shared-gpu-0-evar", False)
    ]
    without_prefix = gpu_sharing_plan.plan_repairs([pod(prefix=None)], [reservation("n0", "g1")], set())
    assert without_prefix.configmaps == []


@pytest.mark.parametrize(
    "sharer",
    [
        pod(node=""),
        pod(phase="Succeeded"),
        pod(phase="Failed"),
        pod(deleting=True),
        pod(groups=None),
    ],
    ids=["not bound", "succeeded", "failed", "being deleted", "no group"],
)
def test_only_live_bound_sharers_are_repaired(sharer: wire.Pod) -> None:
    plan = gpu_sharing_plan.plan_repairs([sharer], [], set())
    assert plan.sharers == []
    assert plan.reservations == {}
    assert plan.configmaps == []


def test_groups_this_binder_is_binding_are_left_to_that_bind() -> None:
    plan = gpu_sharing_plan.plan_repairs([pod()], [], set(), busy={"g1"})
    assert plan.sharers == []
    assert plan.reservations == {}


def test_a_reservation_being_deleted_counts_as_missing() -> None:
    gone = wire.convert(
        wire.Pod,
        {
            **gs.reservation_pod("n0", "g1", image="kairos"),
            "metadata": {
                **gs.reservation_pod("n0", "g1", image="kairos")["metadata"],
                "deletionTimestamp": "2026-01-01T00:00:00Z",
            },
        },
    )
    assert list(gpu_sharing_plan.plan_repairs([pod()], [gone], set()).reservations) == [("n0", "g1")]


# --- the Events' words -------------------------------------------------------------------------------------------
def test_a_recreated_reservation_is_named_and_a_changed_device_explained() -> None:
    same = gpu_sharing_plan.reservation_missing_message("gpu-reservation-1", "GPU-1", "GPU-1")
    assert "kai-resource-reservation/gpu-reservation-1" in same
    assert "restarted" not in same
    moved = gpu_sharing_plan.reservation_missing_message("gpu-reservation-1", "GPU-1", "GPU-2")
    assert "holds GPU-2" in moved
    assert "still uses GPU-1" in moved
    assert "until it is restarted" in moved


def test_a_recreated_configmap_is_named() -> None:
    assert "default/cm-0" in gpu_sharing_plan.configmap_missing_message("default", "cm-0")


# --- options ---------------------------------------------------------------------------------------------------
def test_the_reservation_options_have_kais_defaults_and_split_the_command() -> None:
    settings = parse_options({}).reservations()
    assert settings.image == "kairos"
    assert settings.command == ("python", "-m", "services.gpu_agent.reservation")
    assert settings.service_account == "kairos-reservation"
    assert settings.runtime_class == ""
    assert (settings.timeout, settings.sync, settings.grace) == (60.0, 30.0, 5.0)
    custom = parse_options(
        {"reservation_command": "/bin/reserve  --once", "reservation_timeout": "5", "reservation_grace": "0"}
    ).reservations()
    assert custom.command == ("/bin/reserve", "--once")
    assert (custom.timeout, custom.grace) == (5.0, 0.0)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"reservation_timeout": "soon"}, "option 'reservation_timeout': expected a number, got 'soon'"),
        ({"reservation_timeout": "0"}, "option 'reservation_timeout': expected a number > 0.0, got '0'"),
        ({"reservation_sync": "-1"}, "option 'reservation_sync': expected a number > 0.0, got '-1'"),
        ({"reservation_grace": "-1"}, "option 'reservation_grace': expected a number >= 0.0, got '-1'"),
        ({"reservation_image": " "}, "option 'reservation_image': expected text that is not blank, got ' '"),
    ],
)
def test_a_bad_reservation_option_is_refused_naming_it_and_the_value(
    options: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_options(options)
    assert str(refused.value) == f"service binder: {message}"
