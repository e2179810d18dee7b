"""What the state service believes of a GPU node agent (issue 27, finding 10): an agent speaks only for its
own node, only about now, and can only take capacity away.

- A report (inventory or telemetry) counts only on its own node's subject: the subject is what NATS lets
  an agent's user publish on, so a body naming another node than its subject is refused
  (`services.state.mirror.gpu_overlay.refusal`).
- A report dated in the future beyond `MAX_CLOCK_SKEW` is refused on arrival and counts as stale if it is
  held; a period that is not a number of seconds up to `MAX_PERIOD` cannot keep a report fresh.
- The agent's measured device memory caps the node's GFD label (`nvidia.com/gpu.memory`), never raises it.
- A per-node agent identity (`gpu_agent@<node>`) may publish only its own node's subjects, and an agent
  refuses to start under one naming another node, or with a period longer than a reader honours.
"""

from __future__ import annotations

import pytest

from services.gpu_agent.service import AgentSettings
from services.state.mirror.gpu_inventory import is_stale, merge_inventory
from services.state.mirror.gpu_overlay import GpuOverlay, refusal
from shared.contracts import subjects as s
from shared.contracts.gpu_telemetry import GpuTelemetry
from shared.contracts.inventory import MAX_CLOCK_SKEW, MAX_PERIOD, GpuDevice, GpuInventory
from shared.errors import ConfigError
from shared.model import Node
from shared.security.permissions import GPU_AGENT, declares, node_agent, node_of_agent, permissions
from tests.unit.test_nats_permissions import matches

NOW = 1_800_000_000.0


def inventory(
    node: str = "n1", *, time: float = NOW, period: float = 30.0, memory_mib: int = 81559
) -> GpuInventory:
    devices = (GpuDevice(index=0, uuid="GPU-0", memory_mib=memory_mib),)
    return GpuInventory(node=node, time=time, period=period, devices=devices)


def telemetry(node: str = "n1", *, time: float = NOW, period: float = 5.0) -> GpuTelemetry:
    return GpuTelemetry(node=node, time=time, period=period)


# --- (a) an agent speaks for the node its subject names -----------------------------------------------------
def test_an_inventory_on_its_own_node_s_subject_is_accepted() -> None:
    assert refusal(s.gpu_inventory("n1"), inventory("n1"), NOW) is None
    assert refusal(s.gpu_telemetry("n1"), telemetry("n1"), NOW) is None


def test_an_inventory_naming_another_node_than_its_subject_is_refused_naming_both() -> None:
    reason = refusal(s.gpu_inventory("n2"), inventory("n1"), NOW)
    assert reason == (
        "published on kairos.gpu.inventory.n2, not on the subject of node 'n1' (kairos.gpu.inventory.n1): "
        "an agent speaks only for its own node"
    )


def test_telemetry_naming_another_node_than_its_subject_is_refused() -> None:
    assert refusal(s.gpu_telemetry("n2"), telemetry("n1"), NOW) is not None


def test_an_inventory_on_the_telemetry_subject_of_its_node_is_refused() -> None:
    assert refusal(s.gpu_telemetry("n1"), inventory("n1"), NOW) is not None


def test_a_node_name_with_dots_is_matched_by_its_subject_token() -> None:
    node = "ip-10-0-0-1.ec2.internal"
    assert refusal(s.gpu_inventory(node), inventory(node), NOW) is None
    assert refusal(s.gpu_inventory("ip-10-0-0-2.ec2.internal"), inventory(node), NOW) is not None


# --- (b) only about now -------------------------------------------------------------------------------------
def test_an_inventory_dated_beyond_the_clock_skew_is_refused_on_arrival() -> None:
    ahead = inventory(time=NOW + MAX_CLOCK_SKEW + 1)
    reason = refusal(s.gpu_inventory("n1"), ahead, NOW)
    assert reason is not None
    assert reason.startswith(f"dated {MAX_CLOCK_SKEW + 1:.0f} s ahead of this clock")
    assert refusal(s.gpu_telemetry("n1"), telemetry(time=NOW + 3600), NOW) is not None


def test_an_inventory_within_the_clock_skew_is_accepted() -> None:
    assert refusal(s.gpu_inventory("n1"), inventory(time=NOW + MAX_CLOCK_SKEW), NOW) is None


def test_an_inventory_from_the_future_is_stale_and_so_not_used() -> None:
    far = inventory(time=NOW + 10 * 365 * 86400)
    assert is_stale(far, NOW)
    overlay = GpuOverlay()
    overlay.inventory(far)
    assert overlay.fresh_inventory("n1", NOW) is None


def test_an_inventory_a_little_ahead_goes_stale_after_its_periods_as_any_other() -> None:
    ahead = inventory(time=NOW + MAX_CLOCK_SKEW)
    assert not is_stale(ahead, NOW)
    assert not is_stale(ahead, NOW + MAX_CLOCK_SKEW + 3 * 30.0)
    assert is_stale(ahead, NOW + MAX_CLOCK_SKEW + 3 * 30.0 + 1)


@pytest.mark.parametrize("period", [float("nan"), float("inf"), 0.0, -30.0, MAX_PERIOD + 1, 1e12])
def test_a_period_that_is_not_seconds_up_to_the_maximum_cannot_keep_an_inventory_fresh(period: float) -> None:
    report = inventory(period=period)
    assert is_stale(report, NOW + 1)
    assert refusal(s.gpu_inventory("n1"), report, NOW) is not None
    assert refusal(s.gpu_telemetry("n1"), telemetry(period=period), NOW) is not None


@pytest.mark.parametrize("time", [float("nan"), float("inf"), float("-inf")])
def test_a_time_that_is_not_a_number_is_refused(time: float) -> None:
    assert refusal(s.gpu_inventory("n1"), inventory(time=time), NOW) is not None


# --- (c) can only take capacity away ------------------------------------------------------------------------
def gfd_node(label_mib: int | None) -> Node:
    """A node as `shared.kube.translate` makes it: the GFD label's MiB (synced), or 100 unsynced without it."""
    memory, synced = (label_mib, True) if label_mib else (100, False)
    return Node(
        name="n1",
        cpu_millis=64000,
        memory_bytes=512e9,
        gpus=1,
        gpu_memory_mib=memory,
        gpu_memory_synced=synced,
    )


def test_an_agent_cannot_raise_the_memory_the_node_s_label_gives() -> None:
    merged = merge_inventory(gfd_node(40000), inventory(memory_mib=81559))
    assert (merged.gpu_memory_mib, merged.gpu_memory_synced) == (40000, True)


def test_an_agent_lowers_the_memory_to_what_it_measured() -> None:
    merged = merge_inventory(gfd_node(81500), inventory(memory_mib=40960))
    assert merged.gpu_memory_mib == 40960


def test_without_the_label_the_agent_s_measurement_is_the_only_one() -> None:
    merged = merge_inventory(gfd_node(None), inventory(memory_mib=81559))
    assert (merged.gpu_memory_mib, merged.gpu_memory_synced) == (81559, True)


# --- per-node identities ------------------------------------------------------------------------------------
def test_a_node_s_agent_identity_may_publish_only_its_own_node_s_reports() -> None:
    identity = node_agent("n1")
    granted = permissions(identity)
    assert identity == "gpu_agent@n1"
    assert node_of_agent(identity) == "n1"
    for subject in (s.gpu_inventory("n1"), s.gpu_telemetry("n1")):
        assert any(matches(p, subject) for p in granted.publish), subject
    for subject in (s.gpu_inventory("n2"), s.gpu_telemetry("n2"), s.gpu_inventory("n1") + ".x"):
        assert not any(matches(p, subject) for p in granted.publish), subject
    assert any(matches(p, s.gpu_inventory_request("n1")) for p in granted.subscribe)
    assert not any(matches(p, s.gpu_inventory_request("n2")) for p in granted.subscribe)


def test_a_node_s_agent_identity_holds_nothing_the_shared_agent_identity_does_not() -> None:
    shared = permissions(GPU_AGENT)
    own = permissions(node_agent("ip-10-0-0-1.ec2.internal"))
    for subject in own.publish:
        assert any(matches(p, subject) for p in shared.publish), subject
    assert own.declares is False
    assert declares(node_agent("n1")) is False


def test_a_node_agent_identity_needs_a_node() -> None:
    with pytest.raises(KeyError, match="gpu_agent@"):
        permissions("gpu_agent@")
    assert node_of_agent(GPU_AGENT) is None
    assert node_of_agent("binder") is None


# --- the agent's side ---------------------------------------------------------------------------------------
def agent_settings(*options: str, environ: dict[str, str] | None = None) -> AgentSettings:
    return AgentSettings.from_options(dict(o.split("=", 1) for o in options), environ or {})


def test_an_agent_whose_identity_names_another_node_refuses_to_start() -> None:
    with pytest.raises(
        ConfigError, match=r"KAIROS_NATS_USER 'gpu_agent@n2' may speak only for node 'n2', not for 'n1'"
    ):
        agent_settings("node=n1", environ={"KAIROS_NATS_USER": node_agent("n2")})
    assert agent_settings("node=n1", environ={"KAIROS_NATS_USER": node_agent("n1")}).node == "n1"
    assert agent_settings("node=n1", environ={"KAIROS_NATS_USER": GPU_AGENT}).node == "n1"
    with pytest.raises(ConfigError, match="KAIROS_NATS_USER"):
        agent_settings("node=n1", environ={"KAIROS_NATS_USER": "gpu_agent@"})


@pytest.mark.parametrize("option", ["period", "telemetry_period"])
def test_an_agent_refuses_a_period_longer_than_any_reader_honours(option: str) -> None:
    assert getattr(agent_settings("node=n1", f"{option}={MAX_PERIOD:.0f}"), option) == MAX_PERIOD
    with pytest.raises(
        ConfigError, match=f"option '{option}': expected a number <= {MAX_PERIOD:.1f}, got '601'"
    ):
        agent_settings("node=n1", f"{option}={MAX_PERIOD + 1:.0f}")
