"""Topology level aliases (KAI v0.17, issue 29 deliverable 7): a Topology's level may carry an ``alias``,
and a workload's constraint (``requiredTopologyLevel``, ``preferredTopologyLevel``, on the PodGroup or a
sub-group; the pod annotations ``kai.scheduler/topology-required-placement`` and
``-preferred-placement`` become those fields) may name the level by it.

- translation reads the aliases and refuses, naming ``spec.levels[i].alias``, what KAI's CRD and webhook
  refuse: a non label-key alias, one used twice, one equal to a node label;
- the session resolves a podgroup's aliases to node labels when it opens (KAI resolves them once, building
  its snapshot), so placement and the victim solver decide as if the label had been written;
- a level the topology does not have, by label or alias, leaves the workload pending with KAI's topology
  constraint error, naming the PodGroup field and the levels it could name (before, it stayed pending
  without a word).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core.cycle import fit_error_message
from shared.core.policy import Policy
from shared.core.scheduler import schedule
from shared.errors import InvalidObject
from shared.kube import translate, wire
from shared.model import PodGroup, PodSet, Snapshot, SubGroupSet, Topology, TopologyConstraint
from shared.model.topology_aliases import resolve_aliases
from tests.unit.test_topology import QUEUES, RACK, ZONE, _job, _node, _placed, _run

ALIASED = Topology("zones", (ZONE, RACK), {"zone": ZONE, "rack": RACK})


# --- translation -----------------------------------------------------------------------------------------
def topology(*levels: dict[str, str]) -> wire.Topology:
    return wire.convert(
        wire.Topology,
        {
            "apiVersion": "kai.scheduler/v1alpha1",
            "kind": "Topology",
            "metadata": {"name": "network"},
            "spec": {"levels": list(levels)},
        },
    )


def test_a_topology_reads_its_levels_aliases() -> None:
    got = translate.topology_of(
        topology(
            {"nodeLabel": "accelerator.nvidia.com/rack", "alias": "rack"},
            {"nodeLabel": "kubernetes.io/hostname", "alias": "node"},
            {"nodeLabel": "example.com/unnamed"},
        )
    )
    assert got.levels == ("accelerator.nvidia.com/rack", "kubernetes.io/hostname", "example.com/unnamed")
    assert got.aliases == {"rack": "accelerator.nvidia.com/rack", "node": "kubernetes.io/hostname"}


@pytest.mark.parametrize(
    ("levels", "field", "words"),
    [
        pytest.param(
            [{"nodeLabel": "a.io/rack", "alias": "rack"}, {"nodeLabel": "a.io/block", "alias": "rack"}],
            "spec.levels[1].alias",
            "aliases must be unique",
            id="an alias used by two levels",
        ),
        pytest.param(
            [{"nodeLabel": "a.io/rack"}, {"nodeLabel": "a.io/block", "alias": "a.io/rack"}],
            "spec.levels[1].alias",
            "must not equal a nodeLabel",
            id="an alias that is another level's label",
        ),
        pytest.param(
            [{"nodeLabel": "a.io/rack", "alias": "a.io/rack"}],
            "spec.levels[0].alias",
            "must not equal a nodeLabel",
            id="an alias that is its own label",
        ),
        pytest.param(
            [{"nodeLabel": "a.io/rack", "alias": "my rack"}],
            "spec.levels[0].alias",
            "not a label key",
            id="an alias that is not a label key",
        ),
        pytest.param(
            [{"nodeLabel": "a.io/rack", "alias": "x" * 317}],
            "spec.levels[0].alias",
            "not a label key",
            id="an alias too long",
        ),
    ],
)
def test_a_bad_alias_is_refused_naming_it(levels: list[dict[str, str]], field: str, words: str) -> None:
    with pytest.raises(InvalidObject) as refused:
        translate.topology_of(topology(*levels))
    assert refused.value.field == field
    assert words in str(refused.value)


# --- resolution ------------------------------------------------------------------------------------------
def tree(constraint: TopologyConstraint | None, child: TopologyConstraint | None = None) -> PodGroup:
    """A podgroup whose root carries `constraint`, with a child set and a pod set carrying `child`."""
    leaf = PodSet("leaf", 1, child)
    group = SubGroupSet("child", pod_sets=(leaf,), topology_constraint=child)
    root = SubGroupSet("root", children=(group,), topology_constraint=constraint)
    return PodGroup(name="pg", queue="q", root=root)


@pytest.mark.parametrize(
    ("constraint", "resolved"),
    [
        pytest.param(
            TopologyConstraint("zones", required_level="rack"),
            TopologyConstraint("zones", required_level=RACK),
            id="required by alias",
        ),
        pytest.param(
            TopologyConstraint("zones", preferred_level="zone"),
            TopologyConstraint("zones", preferred_level=ZONE),
            id="preferred by alias",
        ),
        pytest.param(
            TopologyConstraint("zones", required_level="zone", preferred_level="rack"),
            TopologyConstraint("zones", required_level=ZONE, preferred_level=RACK),
            id="both by alias",
        ),
        pytest.param(
            TopologyConstraint("zones", required_level=RACK),
            TopologyConstraint("zones", required_level=RACK),
            id="a node label passes through",
        ),
        pytest.param(
            TopologyConstraint("other", required_level="rack"),
            TopologyConstraint("other", required_level="rack"),
            id="another topology's constraint is left alone",
        ),
        pytest.param(
            TopologyConstraint("zones", required_level="aisle"),
            TopologyConstraint("zones", required_level="aisle"),
            id="an unknown name is left for placement to report",
        ),
    ],
)
def test_a_constraint_names_its_levels_by_label_once_resolved(
    constraint: TopologyConstraint, resolved: TopologyConstraint
) -> None:
    got = resolve_aliases(tree(constraint, constraint), {"zones": ALIASED})
    child = got.root.children[0]
    assert got.root.topology_constraint == resolved
    assert child.topology_constraint == resolved
    assert child.pod_sets[0].topology_constraint == resolved


def test_without_aliases_the_podgroup_is_the_same_object() -> None:
    pg = tree(TopologyConstraint("zones", required_level=RACK))
    assert resolve_aliases(pg, {"zones": ALIASED}) is pg
    assert resolve_aliases(pg, {"zones": Topology("zones", (ZONE, RACK))}) is pg


# --- placement -------------------------------------------------------------------------------------------
def racks_nodes() -> list[Any]:
    # rack1 has one free GPU on a used node (binpack's favourite); rack2 has room for the whole gang.
    return [_node("n0", 2, zone="z1", rack="rack1"), _node("n1", 4, zone="z1", rack="rack2")]


@pytest.mark.parametrize(
    "level", [pytest.param(RACK, id="by node label"), pytest.param("rack", id="by alias")]
)
def test_a_gang_required_in_one_rack_by_alias_goes_where_the_label_sends_it(level: str) -> None:
    other = _job("other", 1, running_on=("n0",))
    ssn = _run(
        racks_nodes(), [other, _job("j", 3, TopologyConstraint("zones", required_level=level))], ALIASED
    )
    assert set(_placed(ssn, "j").values()) == {"n1"}
    assert not ssn.jobs["j"].fit_errors


def test_a_preferred_level_by_alias_orders_domains_as_its_label() -> None:
    nodes = [
        _node("n0", 2, zone="z", rack="r1"),
        _node("n1", 2, zone="z", rack="r2"),
        _node("n2", 2, zone="z", rack="r2"),
    ]
    other = _job("other", 1, running_on=("n0",))
    by_alias = _run(
        nodes,
        [other, _job("j", 2, TopologyConstraint("zones", preferred_level="rack"), created=1.0)],
        ALIASED,
    )
    by_label = _run(
        nodes, [other, _job("j", 2, TopologyConstraint("zones", preferred_level=RACK), created=1.0)], ALIASED
    )
    assert _placed(by_alias, "j") == _placed(by_label, "j")
    assert set(_placed(by_alias, "j").values()) <= {"n1", "n2"}


@pytest.mark.parametrize(
    ("constraint", "says"),
    [
        pytest.param(
            TopologyConstraint("zones", required_level="aisle"),
            "workload specified 'aisle' as the required topology constraint level, but the topology tree "
            "'zones' does not contain a level with this name (spec.topologyConstraint.requiredTopologyLevel; "
            f"its levels: {ZONE} (alias zone), {RACK} (alias rack))",
            id="an unknown required level",
        ),
        pytest.param(
            TopologyConstraint("zones", preferred_level="Rack"),
            "workload specified 'Rack' as the preferred topology constraint level",
            id="an alias in the wrong case is unknown",
        ),
    ],
)
def test_an_unknown_level_leaves_the_workload_pending_and_says_which_field(
    constraint: TopologyConstraint, says: str
) -> None:
    ssn = _run(racks_nodes(), [_job("j", 1, constraint)], ALIASED)
    assert set(_placed(ssn, "j").values()) == {None}
    assert f"topology constraint error: {says}" in (fit_error_message(ssn.jobs["j"].fit_errors) or "")


def test_an_unknown_level_of_a_sub_group_names_the_sub_group() -> None:
    pg, pods = _job("j", 1)
    ps = PodSet("workers", 1, TopologyConstraint("zones", required_level="aisle"))
    pg = msgspec.structs.replace(pg, root=SubGroupSet("", pod_sets=(ps,)))
    pods = [msgspec.structs.replace(p, sub_group="workers") for p in pods]
    ssn = _run(racks_nodes(), [(pg, pods)], ALIASED)
    message = fit_error_message(ssn.jobs["j"].fit_errors) or ""
    assert "sub-group workers specified 'aisle' as the required" in message
    assert "spec.subGroups[name=workers].topologyConstraint.requiredTopologyLevel" in message


def test_preemption_inside_a_rack_named_by_alias_evicts_as_by_label() -> None:
    # One rack full of a low-priority gang; the high-priority gang asks for one rack by alias or label.
    nodes = [_node("n0", 2, zone="z", rack="r1"), _node("n1", 2, zone="z", rack="r2")]
    low_a = _job("low-a", 2, running_on=("n0", "n0"))
    low_b = _job("low-b", 2, running_on=("n1", "n1"))

    def evicted(level: str) -> list[str]:
        high, pods = _job("high", 2, TopologyConstraint("zones", required_level=level), created=5.0)
        high = msgspec.structs.replace(high, priority=100)
        snapshot = Snapshot(
            nodes=tuple(nodes),
            pods=(*low_a[1], *low_b[1], *pods),
            podgroups=(low_a[0], low_b[0], high),
            queues=QUEUES,
            topologies=(ALIASED,),
        )
        result = schedule(snapshot, 1000.0, Policy(actions=("preempt",), staleness_grace_period=0.0))
        return sorted(e.pod for e in result.evictions)

    assert evicted("rack") == evicted(RACK) != []
