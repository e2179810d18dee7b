"""Hierarchical per-resource fair-share division, the way KAI Scheduler's `proportion` plugin computes it.

Mirrors `pkg/scheduler/plugins/proportion` of KAI Scheduler (the `resource_division` package, the
fair-share part of `proportion.go` and the `resource_share` helpers), checked against KAI's
`resource_division_test.go`. Every resource (GPU, CPU, memory) is divided on its own, one sibling group
at a time: the cluster total among the top-level queues, then each queue's fair share among its children,
down to any depth.

Division of an amount among one sibling group, per resource:

1. Deserved phase (priority plays no part): every queue gets `min(quota, requestable)`, where
   requestable is `min(limit, request)` (just `request` when the limit is -1) and a quota of -1 stands
   for the whole amount being divided. Quotas are granted even when they add up to more than the amount
   (KAI over-subscribes in-quota shares rather than scaling them down); the over-quota phase only runs
   when something is left.
2. Over-quota phase, one priority bucket at a time, highest priority first, while something is left:
   rounds of weighted division among the bucket's unsatisfied queues (requestable above fair share).
   Each queue's round share is `amount * w / sum(w)`, with `w = max(0, n + k * (n - usage))` and `n`
   its over-quota weight over the bucket's unsatisfied weight total (with no usage data this is just the
   weight ratio). A queue whose remaining request fits its round share gets exactly that remaining
   request; any other queue gets the round share rounded down to a whole unit and remembers the
   fraction it lost. Queues with weight 0 never get over-quota resources. A further round runs only
   when some queue was satisfied with less than its round share.
3. Rounding leftovers of the bucket, before the next bucket: one unit (or what is left, when less) to
   each queue that lost a fraction, largest fraction first, then older queue, then name. This step can
   give a queue up to one unit more than its requestable amount when the inputs are not whole numbers;
   KAI does the same.

Iteration order inside a group is (creation_index, name), KAI's age order; KAI itself walks Go maps,
which can only change the last bits of floating-point sums.

The module also holds the share primitives that queue ordering (`shared.core.proportion`) and reclaim
(`shared.core.reclaimable`) compare with (`allocatable_share`, `dominant_resource_share`,
`saturation_ratio`, `less_equal`). Pure functions: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import msgspec

__all__ = [
    "FLOAT_TOLERANCE",
    "RESOURCES",
    "UNLIMITED",
    "QueueShare",
    "QueueSpec",
    "ResourceSpec",
    "Vector3",
    "allocatable_share",
    "allocatable_shares",
    "compare_quantities",
    "compute_fair_shares",
    "dominant_resource_share",
    "fair_share_less_than_allocated",
    "less_equal",
    "requestable_share",
    "saturation_ratio",
]

RESOURCES: tuple[str, ...] = ("gpu", "cpu", "memory")
"""Resource order of every vector here: GPU in devices (fractions allowed), CPU in millicores, memory in bytes."""

UNLIMITED = -1.0
"""KAI's `UnlimitedResourceQuantity`: a quota of -1 is unlimited, a limit of -1 is no limit."""

FLOAT_TOLERANCE = 1e-9
"""KAI's `floatComparisonTolerance` for the `<=` comparisons of quantities (not used by the division)."""

# KAI's `noFairShareDrfMultiplier`: a resource with an allocatable share of 0 weighs allocated * 1000.
_NO_FAIR_SHARE_DRF_MULTIPLIER = 1000.0

Vector3 = tuple[float, float, float]
_ZERO: Vector3 = (0.0, 0.0, 0.0)
_N_RESOURCES = 3


class ResourceSpec(msgspec.Struct, frozen=True):
    """One resource of a queue, in the units of `RESOURCES`.

    `quota` is KAI's deserved quota (-1: unlimited, i.e. the whole amount divided at the queue's level),
    `over_quota_weight` its share of surplus among same-priority siblings (0: no surplus at all) and
    `limit` KAI's max-allowed (-1: no limit; 0 is a real limit of nothing).
    """

    quota: float = 0.0
    over_quota_weight: float = 0.0
    limit: float = UNLIMITED


class QueueSpec(msgspec.Struct, frozen=True):
    """A queue of the hierarchy; `parent` is None for a top-level queue.

    `priority` orders the over-quota buckets (higher first); `creation_index` is the queue's age (lower is
    older) and breaks ties the way KAI's creation timestamp does, then `name` the way KAI's queue UID does.
    """

    name: str
    parent: str | None
    priority: int = 100
    creation_index: int = 0
    gpu: ResourceSpec = ResourceSpec()
    cpu: ResourceSpec = ResourceSpec()
    memory: ResourceSpec = ResourceSpec()


class QueueShare(msgspec.Struct, frozen=True):
    """The division result of one queue, each vector in `RESOURCES` order.

    `deserved`, `limit` and `over_quota_weight` are the queue's own settings (-1 kept as is);
    `requested` is its aggregated request (its own entry in `requested` plus all its descendants'),
    not capped by the limit; `fair_share` is what the division gave it.
    """

    deserved: Vector3
    fair_share: Vector3
    requested: Vector3
    limit: Vector3
    over_quota_weight: Vector3


class _Queues:
    """Validated queues as per-resource columns, indexed by position in the age order."""

    def __init__(self, queues: Sequence[QueueSpec]) -> None:
        ordered = sorted(queues, key=lambda q: (q.creation_index, q.name))
        self.specs: list[QueueSpec] = ordered
        self.index: dict[str, int] = {}
        for i, q in enumerate(ordered):
            if q.name in self.index:
                raise ValueError(f"queue {q.name!r}: field 'name': duplicate queue name")
            self.index[q.name] = i
        n = len(ordered)
        self.parent: list[int] = [-1] * n
        self.children: list[list[int]] = [[] for _ in range(n)]
        self.top: list[int] = []
        for i, q in enumerate(ordered):
            if q.parent is None:
                self.top.append(i)
                continue
            p = self.index.get(q.parent)
            if p is None:
                raise ValueError(f"queue {q.name!r}: field 'parent': unknown queue {q.parent!r}")
            self.parent[i] = p
            self.children[p].append(i)
        self._check_cycles(queues)
        self.quota: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
        self.weight: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
        self.limit: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
        for i, q in enumerate(ordered):
            for r, (res_name, spec) in enumerate(zip(RESOURCES, (q.gpu, q.cpu, q.memory), strict=True)):
                self.quota[r][i] = _bound(q.name, f"{res_name}.quota", spec.quota, "-1 (unlimited)")
                self.limit[r][i] = _bound(q.name, f"{res_name}.limit", spec.limit, "-1 (no limit)")
                weight = float(spec.over_quota_weight)
                if not (math.isfinite(weight) and weight >= 0):
                    raise ValueError(
                        f"queue {q.name!r}: field '{res_name}.over_quota_weight': must be finite and >= 0,"
                        f" got {spec.over_quota_weight!r}"
                    )
                self.weight[r][i] = weight

    def _check_cycles(self, queues: Sequence[QueueSpec]) -> None:
        # 0 unvisited, 1 on the current walk, 2 known to reach a top-level queue.
        state = [0] * len(self.specs)
        for start in (self.index[q.name] for q in queues):
            walk: list[int] = []
            i = start
            while i != -1 and state[i] == 0:
                state[i] = 1
                walk.append(i)
                i = self.parent[i]
            if i != -1 and state[i] == 1:
                cycle = [*walk[walk.index(i) :], i]
                names = " -> ".join(self.specs[j].name for j in cycle)
                raise ValueError(f"queue {self.specs[i].name!r}: field 'parent': cycle {names}")
            for j in walk:
                state[j] = 2


def _bound(queue: str, field: str, value: float, special: str) -> float:
    """A quota or limit: -1, or a finite number >= 0."""
    v = float(value)
    if v == UNLIMITED or (math.isfinite(v) and v >= 0):
        return v
    raise ValueError(f"queue {queue!r}: field '{field}': must be >= 0 or {special}, got {value!r}")


def _vector(owner: str, field: str, value: tuple[float, float, float]) -> Vector3:
    """A non-negative finite resource vector; `owner` prefixes the error message."""
    if len(value) != _N_RESOURCES:
        raise ValueError(f"{owner}field '{field}': must have {_N_RESOURCES} values (gpu, cpu, memory)")
    out = (float(value[0]), float(value[1]), float(value[2]))
    for res_name, v in zip(RESOURCES, out, strict=True):
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"{owner}field '{field}.{res_name}': must be finite and >= 0, got {v!r}")
    return out


def compute_fair_shares(
    queues: Sequence[QueueSpec],
    requested: Mapping[str, tuple[float, float, float]],
    total: tuple[float, float, float],
    *,
    usage: Mapping[str, tuple[float, float, float]] | None = None,
    k_value: float = 1.0,
) -> dict[str, QueueShare]:
    """Divide `total` among the queue hierarchy the way KAI's proportion plugin does; one entry per queue.

    `requested` maps a queue to its own request (KAI: the leaf queue's allocated plus pending tasks);
    each entry also counts toward every ancestor, the way KAI walks up `ParentQueue` when it adds a task.
    Queues left out request nothing. `total` is what the top-level queues share (KAI: the allocatable
    resources of the ready nodes, less what pods of other schedulers use).

    `usage` and `k_value` are KAI's time-aware fairness inputs: a queue's historical usage as a fraction
    of cluster capacity per resource (KAI's usage database; queues left out have none) and the plugin's
    `kValue` argument (default 1.0 as in KAI; values <= 0 count as 0). With no usage at all the weights
    reduce to the plain over-quota weights, whatever `k_value` is.

    Raises ValueError naming the queue and the field for a quota or limit below 0 other than -1, a
    negative over-quota weight, an unknown parent, a cycle of parents, a duplicate name, a request or
    usage for an unknown queue, and any negative or non-finite request, usage or total.
    """
    qs = _Queues(queues)
    n = len(qs.specs)
    if not math.isfinite(k_value):
        raise ValueError(f"field 'k_value': must be finite, got {k_value!r}")
    k = k_value if k_value > 0 else 0.0
    cap = _vector("", "total", total)

    request: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
    for name, vec in requested.items():
        i = qs.index.get(name)
        if i is None:
            raise ValueError(f"queue {name!r}: field 'requested': unknown queue")
        values = _vector(f"queue {name!r}: ", "requested", vec)
        while i != -1:
            for r in range(_N_RESOURCES):
                request[r][i] += values[r]
            i = qs.parent[i]

    used: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
    for name, vec in (usage or {}).items():
        i = qs.index.get(name)
        if i is None:
            raise ValueError(f"queue {name!r}: field 'usage': unknown queue")
        values = _vector(f"queue {name!r}: ", "usage", vec)
        for r in range(_N_RESOURCES):
            used[r][i] = values[r]

    fair: list[list[float]] = [[0.0] * n for _ in range(_N_RESOURCES)]
    priority = [q.priority for q in qs.specs]
    for r in range(_N_RESOURCES):
        limit = qs.limit[r]
        req = request[r]
        requestable = [req[i] if limit[i] == UNLIMITED else min(limit[i], req[i]) for i in range(n)]
        division = _Division(qs.quota[r], qs.weight[r], requestable, used[r], fair[r], priority, k)
        # Parents come before their children: each group is divided once its parent's share is final.
        groups: list[tuple[list[int], float]] = [(qs.top, cap[r])]
        while groups:
            members, amount = groups.pop()
            if not members:
                continue
            division.divide(members, amount)
            groups.extend((qs.children[i], fair[r][i]) for i in members if qs.children[i])

    result: dict[str, QueueShare] = {}
    for i, q in enumerate(qs.specs):
        result[q.name] = QueueShare(
            deserved=(qs.quota[0][i], qs.quota[1][i], qs.quota[2][i]),
            fair_share=(fair[0][i], fair[1][i], fair[2][i]),
            requested=(request[0][i], request[1][i], request[2][i]),
            limit=(qs.limit[0][i], qs.limit[1][i], qs.limit[2][i]),
            over_quota_weight=(qs.weight[0][i], qs.weight[1][i], qs.weight[2][i]),
        )
    return result


class _Division:
    """KAI's `resource_division` for one resource, over columns indexed by queue position (= age rank)."""

    def __init__(
        self,
        quota: list[float],
        weight: list[float],
        requestable: list[float],
        usage: list[float],
        fair: list[float],
        priority: list[int],
        k: float,
    ) -> None:
        self.quota = quota
        self.weight = weight
        self.requestable = requestable
        self.usage = usage
        self.fair = fair
        self.priority = priority
        self.k = k

    def divide(self, members: list[int], amount: float) -> float:
        """Divide `amount` among the sibling group `members` (in age order); returns what is left over.

        KAI's `setResourceShare`: deserved phase, then the over-quota phase when something is left.
        """
        fair = self.fair
        remaining = amount
        for i in members:
            deserved = self.quota[i]
            if deserved == UNLIMITED:
                deserved = amount
            given = min(deserved, self.requestable[i])
            fair[i] += given
            remaining -= given
        if remaining <= 0:
            return 0.0
        return self._over_quota(members, remaining)

    def _over_quota(self, members: list[int], remaining: float) -> float:
        """KAI's `divideOverQuotaResource`: priority buckets, highest first, each with its leftovers."""
        buckets: dict[int, list[int]] = {}
        for i in members:
            buckets.setdefault(self.priority[i], []).append(i)
        for prio in sorted(buckets, reverse=True):
            if remaining <= 0:
                break
            remaining, lost = self._up_to_fair_share(remaining, buckets[prio])
            if remaining <= 0 or not lost:
                continue
            remaining = self._give_leftovers(remaining, lost)
        return remaining

    def _up_to_fair_share(self, remaining: float, bucket: list[int]) -> tuple[float, dict[int, float]]:
        """KAI's `divideUpToFairShare`: weighted rounds until no queue was satisfied below its share.

        Returns what is left and, per queue still short of its request, the fraction it lost to rounding
        down in the last round that recorded one.
        """
        fair, weight, requestable, usage, k = self.fair, self.weight, self.requestable, self.usage, self.k
        lost: dict[int, float] = {}
        while True:
            round_amount = remaining
            # KAI's calcShareWeights over the unsatisfied queues (requestable above fair share).
            unsatisfied = [i for i in bucket if requestable[i] > fair[i]]
            total_weight = 0.0
            for i in unsatisfied:
                total_weight += weight[i]
            if total_weight == 0:
                break
            share_weights: list[float] = []
            share_weight_sum = 0.0
            for i in unsatisfied:
                normalized = weight[i] / total_weight
                share_weight = max(0.0, normalized + k * (normalized - usage[i]))
                share_weights.append(share_weight)
                share_weight_sum += share_weight
            if share_weight_sum == 0:
                break
            another_round = False
            for i, share_weight in zip(unsatisfied, share_weights, strict=True):
                if remaining == 0:
                    break
                if weight[i] == 0:
                    continue
                wanted = requestable[i] - fair[i]
                round_share = round_amount * (share_weight / share_weight_sum)
                if wanted <= round_share:
                    given = wanted
                    lost.pop(i, None)
                else:
                    # Capped shares are handed out in whole units; the fraction waits for the leftovers.
                    given = float(math.floor(round_share))
                    if round_share - given > 0:
                        lost[i] = round_share - given
                if given == 0:
                    continue
                fair[i] += given
                remaining -= given
                another_round = another_round or wanted < round_share
            if not another_round or remaining == 0:
                break
        return remaining, lost

    def _give_leftovers(self, remaining: float, lost: dict[int, float]) -> float:
        """KAI's `divideRemainingResource`: one unit each, largest lost fraction first, then age, then name."""
        fair = self.fair
        # Queue positions are the (creation_index, name) rank, so the index breaks ties like KAI does.
        for i in sorted(lost, key=lambda j: (-lost[j], j)):
            if remaining == 0:
                break
            given = min(1.0, remaining)
            fair[i] += given
            remaining -= given
        return remaining


# ---------------------------------------------------------------------------------------------------------
# Shares and comparisons used by queue ordering and reclaim (KAI `resource_share`, `queue_order`, `reclaimable`)
# ---------------------------------------------------------------------------------------------------------


def requestable_share(request: float, limit: float) -> float:
    """KAI `ResourceShare.GetRequestableShare`: the request, capped by the limit unless the limit is -1."""
    return request if limit == UNLIMITED else min(limit, request)


def allocatable_share(deserved: float, fair_share: float, limit: float) -> float:
    """KAI `ResourceShare.GetAllocatableShare` for one resource.

    The larger of deserved quota and fair share, capped by the limit (when not -1). An unlimited (-1)
    quota makes it the limit itself, which may be -1 (unlimited).
    """
    if deserved == UNLIMITED:
        return limit
    allocatable = max(deserved, fair_share)
    if limit != UNLIMITED:
        allocatable = min(limit, allocatable)
    return allocatable


def allocatable_shares(share: QueueShare) -> Vector3:
    """`allocatable_share` of each resource of a queue's division result."""
    d, f, lim = share.deserved, share.fair_share, share.limit
    return (
        allocatable_share(d[0], f[0], lim[0]),
        allocatable_share(d[1], f[1], lim[1]),
        allocatable_share(d[2], f[2], lim[2]),
    )


def dominant_resource_share(allocated: Vector3, allocatable: Vector3, total: Vector3) -> float:
    """KAI `QueueResourceShare.GetDominantResourceShare`: the largest allocated/allocatable ratio.

    An allocatable share of -1 (unlimited) is replaced by the cluster `total` of that resource; an
    allocatable share of 0 makes the resource weigh `allocated * 1000`. Never below 0. Queue ordering puts
    the queue with the smaller value first.
    """
    dominant = 0.0
    for alloc, able, cap in zip(allocated, allocatable, total, strict=True):
        denominator = cap if able == UNLIMITED else able
        value = alloc * _NO_FAIR_SHARE_DRF_MULTIPLIER if denominator == 0 else alloc / denominator
        dominant = max(dominant, value)
    return dominant


def saturation_ratio(allocated: float, fair_share: float) -> float:
    """KAI `fairShareSaturationRatio` (reclaim): allocated / fair share of one resource.

    A fair share of 0 gives +inf when something is allocated and 0 otherwise; a fair share of -1 gives 0.
    """
    if fair_share == 0:
        return math.inf if allocated > 0 else 0.0
    if fair_share == UNLIMITED:
        return 0.0
    return allocated / fair_share


def compare_quantities(quantity: float, other: float) -> int:
    """KAI `compareQuantities`: -1, 0 or 1, with -1 (unlimited) above everything else.

    Values within `FLOAT_TOLERANCE` of each other compare equal.
    """
    if quantity == UNLIMITED:
        return 0 if other == UNLIMITED else 1
    if other == UNLIMITED:
        return -1
    if not (quantity <= other or abs(quantity - other) <= FLOAT_TOLERANCE):
        return 1
    if not (other <= quantity or abs(quantity - other) <= FLOAT_TOLERANCE):
        return -1
    return 0


def less_equal(left: Iterable[float], right: Iterable[float]) -> bool:
    """KAI `ResourceQuantities.LessEqual`: every resource of `left` is <= that of `right` (-1: unlimited)."""
    return all(compare_quantities(a, b) <= 0 for a, b in zip(left, right, strict=True))


def fair_share_less_than_allocated(fair_share: Vector3, allocated: Vector3) -> bool:
    """KAI `FairShareLessThanAllocated`: over its fair share in every resource (strict, no tolerance).

    This is the "over-utilized" test of queue ordering; a queue over its fair share in only some
    resources is not over-utilized.
    """
    return all(f < a for f, a in zip(fair_share, allocated, strict=True))
