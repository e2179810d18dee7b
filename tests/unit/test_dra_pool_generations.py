"""Specs for DRA pool generations (issue 30): a pool's slices of an older ``spec.pool.generation`` than its
newest are ignored, as the structured allocator reads them (a driver replacing a pool's slices publishes
the new generation before it deletes the old), for allocation and for the GPUs a node counts; a
generation that is not a non-negative integer leaves that slice out, naming the field.
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from shared.core.dra_accounting import account, current_slices
from shared.errors import InvalidObject
from shared.kube import dra as kd
from shared.model.dra import Dra, ResourceSlice
from tests.unit.test_dra_allocator import (
    GPU_CLASS,
    claim,
    gpu,
    gpu_slice,
    job,
    node,
    pending_reason,
    placements,
    request,
    run,
    snapshot,
)


def generation(s: ResourceSlice, n: int, name: str = "") -> ResourceSlice:
    return msgspec.structs.replace(s, generation=n, name=name or f"{s.name}-g{n}")


@pytest.mark.parametrize(
    ("generations", "kept"),
    [
        pytest.param([0], [0], id="one generation: kept"),
        pytest.param([1, 2], [2], id="the older generation is ignored"),
        pytest.param([3, 3], [3, 3], id="two slices of the newest generation: both kept"),
        pytest.param([2, 1, 2], [2, 2], id="whatever their order"),
    ],
)
def test_only_each_pools_newest_generation_is_read(generations: list[int], kept: list[int]) -> None:
    base = gpu_slice("node-1", gpu(0))
    slices = [generation(base, g, f"s{i}") for i, g in enumerate(generations)]
    other_pool = msgspec.structs.replace(base, pool="node-2", name="other", generation=0)
    assert [s.generation for s in current_slices([*slices, other_pool]) if s.pool == "node-1"] == kept
    assert other_pool in current_slices([*slices, other_pool]), "each pool by its own newest"


def test_a_device_only_an_older_generation_publishes_is_not_allocated() -> None:
    old = generation(gpu_slice("node-1", gpu(0), gpu(1)), 1)
    new = generation(gpu_slice("node-1", gpu(0)), 2)
    dra = Dra(classes=(GPU_CLASS,), slices=(old, new), claims=(claim("c", request(count=2)),))
    # One GPU on the node now: KAI's GPU count refuses it before the allocator would.
    assert "didn't have enough resources: GPUs" in pending_reason(
        run(snapshot([node("node-1")], [job("job", "c")], dra))
    )
    one = Dra(classes=(GPU_CLASS,), slices=(old, new), claims=(claim("c"),))
    ((allocation,),) = [
        c for _, c in placements(run(snapshot([node("node-1")], [job("job", "c")], one))).values()
    ]
    assert [r.device for r in allocation.devices] == ["gpu-0"]


def test_a_node_counts_the_gpus_of_its_pools_newest_generation_only() -> None:
    old = generation(gpu_slice("node-1", gpu(0), gpu(1)), 1)
    new = generation(gpu_slice("node-1", gpu(0), gpu(1)), 2)
    (counted,) = account(snapshot([node("node-1")], [], Dra(slices=(old, new)))).nodes
    assert counted.gpus == 2


def _slice(pool: dict[str, Any]) -> kd.WireResourceSlice:
    doc = {"metadata": {"name": "s"}, "spec": {"driver": "gpu.nvidia.com", "pool": pool, "nodeName": "n1"}}
    return msgspec.json.decode(msgspec.json.encode(doc), type=kd.WireResourceSlice)


@pytest.mark.parametrize(
    ("pool", "read"),
    [
        pytest.param({"name": "p", "generation": 4, "resourceSliceCount": 1}, 4, id="read"),
        pytest.param({"name": "p"}, 0, id="absent: 0"),
        pytest.param({"name": "p", "generation": -1}, None, id="negative"),
        pytest.param({"name": "p", "generation": "1"}, None, id="a string"),
        pytest.param({"name": "p", "generation": True}, None, id="a boolean"),
        pytest.param({"generation": 1}, None, id="a pool with no name"),
    ],
)
def test_a_slices_pool_generation_is_read_and_a_malformed_one_names_its_field(
    pool: dict[str, Any], read: int | None
) -> None:
    if read is None:
        with pytest.raises(InvalidObject, match=r"spec\.pool\.(generation|name)"):
            kd.slice_of(_slice(pool))
    else:
        assert kd.slice_of(_slice(pool)).generation == read
