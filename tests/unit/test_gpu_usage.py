"""Specs of `services.state.mirror.gpu_usage`: the decayed average, device health, the hysteresis that keeps
telemetry from churning the state bucket, and the simulated cluster's telemetry."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.mirror.gpu_usage import (
    HALF_LIFE_S,
    HEALTHY_PERIODS,
    UNHEALTHY_GPUS_LABEL,
    NodeUsage,
    decayed,
    fold,
    groups_of,
    is_stale,
    needs_rewrite,
    observe,
    place_on_devices,
    simulated_telemetry,
    usage_of,
)
from shared.contracts.gpu_telemetry import DeviceTelemetry, GpuTelemetry
from shared.errors import InvalidObject
from shared.model import GpuRequest, Node, Pod, PodStatus
from shared.model.objects import DeviceUsage
from tests import builders

percent = st.floats(0, 100, allow_nan=False)
seconds = st.floats(0, 1000, allow_nan=False)
half_lives = st.floats(0.5, 600, allow_nan=False)


def reading(index: int = 0, **fields: object) -> DeviceTelemetry:
    values: dict[str, object] = {"uuid": f"GPU-{index}", "memory_total_mib": 1000, "memory_used_mib": 0}
    values.update(fields)
    return DeviceTelemetry(index=index, **values)  # type: ignore[arg-type]


def telemetry(time: float, *devices: DeviceTelemetry, node: str = "n1", period: float = 5.0) -> GpuTelemetry:
    return GpuTelemetry(node=node, time=time, period=period, devices=devices)


# --- the decay -----------------------------------------------------------------------------------------
@settings(max_examples=200, deadline=None)
@given(previous=percent, sample=percent, elapsed=seconds, half_life=half_lives)
def test_the_average_lies_between_the_previous_average_and_the_sample(
    previous: float, sample: float, elapsed: float, half_life: float
) -> None:
    value = decayed(previous, sample, elapsed, half_life)
    assert value is not None
    assert min(previous, sample) - 1e-9 <= value <= max(previous, sample) + 1e-9


@settings(max_examples=200, deadline=None)
@given(previous=percent, sample=percent, half_life=half_lives)
def test_after_one_half_life_the_previous_average_weighs_half(
    previous: float, sample: float, half_life: float
) -> None:
    value = decayed(previous, sample, half_life, half_life)
    assert value == pytest.approx((previous + sample) / 2, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(previous=percent, sample=percent, first=seconds, second=seconds, half_life=half_lives)
def test_two_readings_of_the_same_sample_decay_as_one_over_their_sum(
    previous: float, sample: float, first: float, second: float, half_life: float
) -> None:
    """The period does not matter: the same load seen every 1 s or every 10 s gives the same average."""
    stepwise = decayed(decayed(previous, sample, first, half_life), sample, second, half_life)
    assert stepwise == pytest.approx(decayed(previous, sample, first + second, half_life), abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(previous=percent, sample=percent, shorter=seconds, longer=seconds, half_life=half_lives)
def test_the_longer_the_gap_the_closer_the_average_to_the_sample(
    previous: float, sample: float, shorter: float, longer: float, half_life: float
) -> None:
    shorter, longer = sorted((shorter, longer))
    near = decayed(previous, sample, longer, half_life)
    far = decayed(previous, sample, shorter, half_life)
    assert near is not None
    assert far is not None
    assert abs(near - sample) <= abs(far - sample) + 1e-9


@given(value=percent, elapsed=seconds)
def test_a_steady_load_is_its_own_average_and_gaps_without_a_sample_change_nothing(
    value: float, elapsed: float
) -> None:
    assert decayed(value, value, elapsed, HALF_LIFE_S) == pytest.approx(value)
    assert decayed(value, None, elapsed, HALF_LIFE_S) == value
    assert decayed(None, value, elapsed, HALF_LIFE_S) == value


def test_a_ten_second_burst_moves_a_thirty_second_average_a_fifth_of_the_way() -> None:
    usage = observe(None, telemetry(0.0, reading(utilisation_pct=0.0)))
    usage = observe(usage, telemetry(10.0, reading(utilisation_pct=100.0)))
    assert usage is not None
    assert usage.devices[0].utilisation_pct == pytest.approx(100 * (1 - 0.5 ** (10 / 30)))


def test_memory_pressure_is_used_over_total_and_missing_readings_stay_unknown() -> None:
    usage = observe(
        None,
        telemetry(
            0.0,
            reading(0, memory_used_mib=250, utilisation_pct=None),
            reading(1, memory_used_mib=None, memory_total_mib=None, utilisation_pct=30.0),
        ),
    )
    assert usage is not None
    first, second = usage.devices
    assert (first.memory_pct, first.utilisation_pct) == (25.0, None)
    assert (second.memory_pct, second.utilisation_pct) == (None, 30.0)
    assert [(d.utilisation_pct, d.memory_pct) for d in usage_of(usage)] == [(0.0, 25.0), (30.0, 0.0)]


def test_a_reading_older_than_the_last_or_without_nvml_changes_nothing() -> None:
    usage = observe(None, telemetry(10.0, reading(utilisation_pct=50.0)))
    assert observe(usage, telemetry(5.0, reading(utilisation_pct=0.0))) is usage
    broken = GpuTelemetry(node="n1", time=20.0, period=5.0, error="nvmlInit: NVMLError_DriverNotLoaded")
    assert observe(usage, broken) is usage


def test_telemetry_of_another_node_or_a_bad_half_life_is_refused_naming_the_field() -> None:
    usage = observe(None, telemetry(0.0, reading()))
    with pytest.raises(InvalidObject, match="node"):
        observe(usage, telemetry(1.0, reading(), node="n2"))
    with pytest.raises(InvalidObject, match="half_life"):
        observe(None, telemetry(0.0, reading()), half_life=0.0)


def test_usage_goes_stale_after_three_of_its_agent_s_periods() -> None:
    usage = NodeUsage(node="n1", time=100.0, period=5.0)
    assert not is_stale(usage, 115.0)
    assert is_stale(usage, 115.5)
    assert not is_stale(usage, 50.0)  # an agent clock ahead of ours is not stale


# --- health --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (reading(xid_errors=(79,)), "XID 79"),
        (reading(xid_errors=(48, 63)), "XID 48, 63"),
        (reading(ecc_uncorrected=2), "2 uncorrected ECC errors"),
        (
            reading(responding=False, error="nvmlDeviceGetMemoryInfo: NVMLError_GpuIsLost"),
            "not responding: nvmlDeviceGetMemoryInfo: NVMLError_GpuIsLost",
        ),
    ],
)
def test_a_device_is_unhealthy_from_its_first_bad_reading_until_enough_clean_ones(
    bad: DeviceTelemetry, reason: str
) -> None:
    usage = observe(None, telemetry(0.0, reading()))
    usage = observe(usage, telemetry(5.0, bad))
    assert usage is not None
    assert (usage.devices[0].healthy, usage.devices[0].reason) == (False, reason)
    for k in range(1, HEALTHY_PERIODS):
        usage = observe(usage, telemetry(5.0 + 5 * k, reading()))
        assert usage is not None
        assert (usage.devices[0].healthy, usage.devices[0].reason) == (False, reason), k
    usage = observe(usage, telemetry(5.0 + 5 * HEALTHY_PERIODS, reading()))
    assert usage is not None
    assert (usage.devices[0].healthy, usage.devices[0].reason) == (True, "")


def test_a_flapping_device_starts_its_clean_count_again() -> None:
    usage = observe(None, telemetry(0.0, reading(xid_errors=(79,))))
    usage = observe(usage, telemetry(5.0, reading()))
    usage = observe(usage, telemetry(10.0, reading(xid_errors=(79,))))
    for t in (15.0, 20.0):
        usage = observe(usage, telemetry(t, reading()))
    assert usage is not None
    assert not usage.devices[0].healthy


def test_a_replaced_device_with_another_uuid_starts_afresh() -> None:
    usage = observe(None, telemetry(0.0, reading(xid_errors=(79,), utilisation_pct=90.0)))
    usage = observe(usage, telemetry(5.0, reading(uuid="GPU-new", utilisation_pct=10.0)))
    assert usage is not None
    assert (usage.devices[0].healthy, usage.devices[0].utilisation_pct) == (True, 10.0)


# --- hysteresis and the node ---------------------------------------------------------------------------
def device(index: int = 0, use: float = 0.0, memory: float = 0.0, **fields: object) -> DeviceUsage:
    values: dict[str, object] = {"utilisation_pct": use, "memory_pct": memory, **fields}
    return DeviceUsage(index=index, **values)  # type: ignore[arg-type]


def test_a_node_is_rewritten_only_on_a_move_of_ten_points_or_a_health_change() -> None:
    written = (device(0, 40.0, 40.0), device(1, 0.0, 0.0))
    assert not needs_rewrite(written, (device(0, 49.9, 31.0), device(1, 9.9, 0.0)))
    assert needs_rewrite(written, (device(0, 50.0, 40.0), device(1)))
    assert needs_rewrite(written, (device(0, 40.0, 29.0), device(1)))
    assert needs_rewrite(written, (device(0, 40.0, 40.0), device(1, healthy=False, reason="XID 79")))
    assert needs_rewrite(written, (device(0, 40.0, 40.0), device(1, gpu_group="g1")))
    assert needs_rewrite(written, written[:1])
    node = Node(name="n1", cpu_millis=1000, memory_bytes=1e9, gpus=2, gpu_devices=written)
    assert fold(node, (device(0, 45.0, 40.0), device(1))) is node
    assert fold(node, (device(0, 55.0, 40.0), device(1))).gpu_devices[0].utilisation_pct == 55.0


@pytest.mark.parametrize("field", ["utilisation_pct", "memory_pct"])
@pytest.mark.parametrize("value", [-1.0, 100.5, math.nan])
def test_a_node_refuses_device_use_outside_0_to_100_naming_node_and_field(field: str, value: float) -> None:
    with pytest.raises(InvalidObject) as caught:
        Node(
            name="n7",
            cpu_millis=1,
            memory_bytes=1,
            gpus=2,
            gpu_devices=(device(0), device(1, **{field: value})),
        )
    assert "n7" in str(caught.value)
    assert f"gpu_devices[1].{field}" in str(caught.value)


# --- the simulated cluster -----------------------------------------------------------------------------
def pod(name: str, gpu: GpuRequest, groups: tuple[str, ...] = ()) -> Pod:
    return builders.pod(name, node="n1", status=PodStatus.RUNNING, gpu=gpu, gpu_groups=groups)


def test_simulated_devices_are_used_as_their_pods_ask_with_seeded_noise() -> None:
    node = Node(name="n1", cpu_millis=1000, memory_bytes=1e9, gpus=4, gpu_memory_mib=80000)
    pods = [
        pod("a", GpuRequest(devices=1, fraction=0.5), ("g2",)),
        pod("b", GpuRequest(devices=1, fraction=0.25), ("g2",)),
        pod("c", GpuRequest(devices=1, fraction=0.5), ("g1",)),
        pod("d", GpuRequest(devices=1)),
    ]
    reading_, occupancy = simulated_telemetry(node, pods, now=100.0, period=5.0, seed=7)
    assert groups_of(occupancy) == {0: "g1", 1: "g2"}
    assert occupancy[2] == "pod:/d:0"
    by_index = {d.index: d for d in reading_.devices}
    assert by_index[0].utilisation_pct == pytest.approx(50, abs=4)
    assert by_index[1].utilisation_pct == pytest.approx(75, abs=4)
    assert by_index[2].utilisation_pct == pytest.approx(85, abs=4)
    assert by_index[3].utilisation_pct is not None
    assert by_index[3].utilisation_pct <= 4
    assert by_index[1].memory_used_mib == 60000
    assert simulated_telemetry(node, pods, now=100.0, period=5.0, seed=7) == (reading_, occupancy)
    assert simulated_telemetry(node, pods, now=105.0, period=5.0, seed=7)[0] != reading_


def test_a_simulated_node_label_makes_devices_report_xid_79() -> None:
    node = Node(name="n1", cpu_millis=1, memory_bytes=1, gpus=3, labels={UNHEALTHY_GPUS_LABEL: "2, 0"})
    reading_, _ = simulated_telemetry(node, [], now=0.0, period=5.0)
    assert [d.xid_errors for d in reading_.devices] == [(79,), (), (79,)]
    usage = observe(None, reading_)
    assert usage is not None
    assert [d.healthy for d in usage_of(usage)] == [False, True, False]


def test_simulated_devices_stay_with_their_pods_and_newcomers_skip_unhealthy_devices() -> None:
    node = Node(name="n1", cpu_millis=1, memory_bytes=1, gpus=4, labels={UNHEALTHY_GPUS_LABEL: "1"})
    first = place_on_devices(node, [pod("w", GpuRequest(devices=1))])
    assert first == {0: "pod:/w:0"}
    later = place_on_devices(
        node, [pod("w", GpuRequest(devices=1)), pod("f", GpuRequest(devices=1, fraction=0.5), ("g0",))], first
    )
    assert later == {0: "pod:/w:0", 2: "group:g0"}
    assert place_on_devices(node, [pod("f", GpuRequest(devices=1, fraction=0.5), ("g0",))], later) == {
        2: "group:g0"
    }
