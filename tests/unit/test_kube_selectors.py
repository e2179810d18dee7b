"""Specs: a node selector is read by the same rules whichever object carries it (`shared.kube.selectors`):
a pod's required node affinity, a PersistentVolume's node affinity and a ResourceSlice's node selector
accept the same terms and refuse the same ones, as the API server does, each error naming the object and the
field of the term."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from shared.errors import InvalidObject
from shared.kube import dra, keys, translate, volumes
from shared.model import LabelSelectorTerm, NodeSelectorRequirement
from tests.unit.test_kube_translate import pod, pod_doc

NODE_NAME = keys.NODE_NAME_LABEL


def _pod(terms: list[dict[str, Any]]) -> tuple[LabelSelectorTerm, ...]:
    affinity = {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
    }
    return translate.pod_of(pod(pod_doc(affinity=affinity))).node_affinity


def _volume(terms: list[dict[str, Any]]) -> tuple[LabelSelectorTerm, ...]:
    obj = {
        "metadata": {"name": "pv-1"},
        "spec": {"capacity": {"storage": "1Gi"}, "nodeAffinity": {"required": {"nodeSelectorTerms": terms}}},
    }
    raw = volumes.decode("persistentvolumes", msgspec.json.encode(obj))
    assert isinstance(raw, volumes.WireVolume)
    return volumes.volume_of(raw).node_affinity


def _slice(terms: list[dict[str, Any]]) -> tuple[LabelSelectorTerm, ...]:
    obj = {
        "metadata": {"name": "s-1"},
        "spec": {
            "driver": "gpu.nvidia.com",
            "pool": {"name": "p"},
            "nodeSelector": {"nodeSelectorTerms": terms},
        },
    }
    return dra.slice_of(
        msgspec.json.decode(msgspec.json.encode(obj), type=dra.WireResourceSlice)
    ).node_selector


# Each reader, the object its errors name, and where its terms are.
READERS: list[tuple[Callable[[list[dict[str, Any]]], tuple[LabelSelectorTerm, ...]], str, str]] = [
    (
        _pod,
        "Pod",
        "spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms",
    ),
    (_volume, "PersistentVolume", "spec.nodeAffinity.required.nodeSelectorTerms"),
    (_slice, "ResourceSlice", "spec.nodeSelector.nodeSelectorTerms"),
]
READER_IDS = ["pod", "persistent-volume", "resource-slice"]


@pytest.mark.parametrize(("read", "kind", "at"), READERS, ids=READER_IDS)
def test_every_kind_reads_expressions_and_the_node_name_field_into_the_same_terms(
    read: Callable[[list[dict[str, Any]]], tuple[LabelSelectorTerm, ...]], kind: str, at: str
) -> None:
    terms = [
        {
            "matchExpressions": [
                {"key": "zone", "operator": "In", "values": ["a"]},
                {"key": "gen", "operator": "Gt", "values": ["3"]},
            ],
            "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}],
        }
    ]
    assert read(terms) == (
        LabelSelectorTerm(
            (
                NodeSelectorRequirement("zone", "In", ("a",)),
                NodeSelectorRequirement("gen", "Gt", ("3",)),
                NodeSelectorRequirement(NODE_NAME, "NotIn", ("n9",)),
            )
        ),
    )


@pytest.mark.parametrize(
    ("term", "field", "problem"),
    [
        ({"matchExpressions": [{"key": "k", "operator": "Near", "values": ["a"]}]}, "matchExpressions[0].operator", "must be one of"),
        ({"matchExpressions": [{"key": "k", "operator": "In", "values": []}]}, "matchExpressions[0].values", "must not be empty"),
        ({"matchExpressions": [{"key": "k", "operator": "Exists", "values": ["a"]}]}, "matchExpressions[0].values", "must be empty"),
        ({"matchExpressions": [{"key": "k", "operator": "Gt", "values": ["1", "2"]}]}, "matchExpressions[0].values", "takes one integer"),
        ({"matchExpressions": [{"key": "k", "operator": "Lt", "values": ["ten"]}]}, "matchExpressions[0].values", "takes one integer"),
        ({"matchFields": [{"key": "metadata.uid", "operator": "In", "values": ["x"]}]}, "matchFields[0].key", "only metadata.name"),
        ({"matchFields": [{"key": "metadata.name", "operator": "Exists", "values": []}]}, "matchFields[0]", "In or NotIn with one value"),
        ({"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a", "b"]}]}, "matchFields[0]", "In or NotIn with one value"),
    ],
)  # fmt: skip
@pytest.mark.parametrize(("read", "kind", "at"), READERS, ids=READER_IDS)
def test_every_kind_refuses_what_the_api_server_refuses_naming_the_object_and_the_field(
    read: Callable[[list[dict[str, Any]]], tuple[LabelSelectorTerm, ...]],
    kind: str,
    at: str,
    term: dict[str, Any],
    field: str,
    problem: str,
) -> None:
    with pytest.raises(InvalidObject) as caught:
        read([{"matchExpressions": [{"key": "ok", "operator": "Exists"}]}, term])
    assert caught.value.kind == kind
    assert caught.value.field == f"{at}[1].{field}"
    assert problem in caught.value.problem


@pytest.mark.parametrize(("read", "kind", "at"), READERS[:2], ids=READER_IDS[:2])
def test_a_required_selector_of_only_empty_terms_matches_no_node(
    read: Callable[[list[dict[str, Any]]], tuple[LabelSelectorTerm, ...]], kind: str, at: str
) -> None:
    assert read([{}, {}]) == (LabelSelectorTerm((NodeSelectorRequirement(NODE_NAME, "In", ()),)),)
