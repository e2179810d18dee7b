"""The plugin runtime: the one place the core runs a session's plugin chains, and the one place a plugin's
exception is caught.

Modelled on kube-scheduler's framework runtime: one interface per extension point
(`shared.core.plugins.points`), a runner per point here, and every answer or failure a `Status` naming the
plugin. The core's modules never loop over a chain themselves; they ask the session's `Runtime`
(`Session.plugins`, built once per session from the resolved `Chains`):

- `filter` / `prefilter`: the node filters in chain order, the first refusal wins; a filter that raises
  refuses the node with `Code.ERROR` and its name in the reason, so the pod's fit error names the broken
  plugin and the other pods are placed as before (kube-scheduler fails the pod outright on a filter error;
  Kairos refuses the nodes where the filter fails, which is the same wherever it fails on every node). A
  pre-filter that raises refuses nothing: the filters are then asked node by node.
- `scores`: the node scores summed; one that raises raises `PluginError` with its `Status`, and the
  allocation fails the pod with that reason on every node it was to try (kube-scheduler's RunScorePlugins
  fails the pod on an error status).
- `device_score`, `compare_queues`, the job / pod / pod-set keys: a plugin that raises has no preference
  for that call (device score 0, queue comparison 0, the key sorting after every key that did not fail), so
  an order's failure moves work later, never stops it.
- `job_capacity` / `node_capacity`: a quota check that raises answers "does not fit" with its name, the
  job's (or node's) fit error.
- `victim_filters`: a victim filter that raises keeps no victim and validates no scenario, so no pod is
  evicted on a broken plugin's word.

Every failure that fails no pod is kept in `Runtime.errors` (one per plugin and extension point), so the
session can still say what went wrong. A plugin's exception never leaves the runtime except as
`PluginError`, and that never leaves the allocation of the pod.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from shared.core.plugins.points import Code, Status
from shared.core.proportion import CapacityResult

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from shared.core.cluster import NodeState
    from shared.core.plugins.chain import Chains
    from shared.core.plugins.points import NodeFilter, NodeScore, OrderKey, VictimAction, VictimFilter
    from shared.core.proportion import QueueView
    from shared.core.tasks import JobState, SubGroupMember, TaskState

__all__ = ["LAST", "PluginError", "Runtime", "failure"]

S = TypeVar("S")
X = TypeVar("X")


class PluginError(Exception):
    """A plugin raised where its failure fails the pod being evaluated (a node score): `status` says which
    plugin and why."""

    def __init__(self, status: Status) -> None:
        self.status = status
        super().__init__(status.reason)


def failure(plugin: str, point: str, exc: Exception) -> Status:
    """The `Status` of a plugin that raised `exc` at extension point `point`."""
    return Status(f"plugin {plugin!r} failed in {point}: {type(exc).__name__}: {exc}", Code.ERROR, plugin)


class _Last:
    """Sorts after every other key part (a float or a str), equal only to itself."""

    __slots__ = ()

    def __lt__(self, other: object) -> bool:
        return False

    def __gt__(self, other: object) -> bool:
        return other is not self

    def __repr__(self) -> str:
        return "LAST"


LAST: Final[Any] = _Last()
"""The key part of an order that raised: the item sorts after every item whose order answered."""


class Runtime(Generic[S]):
    """Runs a session's chains (`Chains`): one method per extension point, each catching its plugins'
    exceptions (see the module's docstring for what each failure means)."""

    __slots__ = (
        "_device_orders",
        "_filters",
        "_prefilters",
        "_queue_orders",
        "_quota_checks",
        "_scores",
        "_seen",
        "chains",
        "errors",
        "job_key",
        "pod_set_key",
        "task_key",
    )

    def __init__(self, chains: Chains[S]) -> None:
        self.chains = chains
        self.errors: list[Status] = []
        """The failures that failed no pod (orders, queue comparisons, device orders, victim filters,
        pre-filters), one per plugin and extension point, in the order they happened."""
        self._seen: set[tuple[str | None, str]] = set()
        self._filters = chains.node_filters
        self._prefilters = chains.node_prefilters
        self._scores = chains.node_scores
        self._device_orders = chains.device_orders
        self._queue_orders = chains.queue_orders
        self._quota_checks = chains.quota_checks
        self.job_key: Callable[[JobState], OrderKey] = self._keys("job_order", "job_key", _job_tail)
        """The job orders' parts concatenated, then creation time and key (KAI's fallback)."""
        self.task_key: Callable[[TaskState], OrderKey] = self._keys("task_order", "task_key", _task_tail)
        """The task orders' parts concatenated, then creation time and key."""
        self.pod_set_key: Callable[[SubGroupMember], OrderKey] = self._keys(
            "pod_set_order", "pod_set_key", _pod_set_tail
        )
        """The pod-set orders' parts concatenated, then the member's name."""

    # --- who failed ------------------------------------------------------------------------------------------
    def owner(self, point: str, implementation: object) -> str:
        """The name of the enabled plugin whose `point` field is `implementation` (the first, should two
        plugins share one object)."""
        for name, plugin in self.chains.plugins:
            if getattr(plugin, point) is implementation:
                return name
        return "<unknown>"

    def _note(self, status: Status, point: str) -> Status:
        if (status.plugin, point) not in self._seen:
            self._seen.add((status.plugin, point))
            self.errors.append(status)
        return status

    def _failed(self, point: str, method: str, implementation: object, exc: Exception) -> Status:
        return failure(self.owner(point, implementation), method, exc)

    # --- node filters --------------------------------------------------------------------------------------
    def filter(self, ssn: S, task: TaskState, node: NodeState) -> Status | None:
        """The first refusal of the node filters in chain order, None when all pass. A plain-string answer
        is read as UNSCHEDULABLE; a filter that raises refuses the node with `Code.ERROR`."""
        current: NodeFilter[S] | None = None
        try:
            for current in self._filters:
                answer = current.filter(ssn, task, node)
                if answer is not None:
                    return Status(answer) if isinstance(answer, str) else answer
        except Exception as exc:  # noqa: BLE001 -- a plugin's failure refuses the node, never the cycle
            return self._failed("node_filter", "filter", current, exc)
        return None

    def prefilter(self, ssn: S, task: TaskState) -> npt.NDArray[np.bool_] | None:
        """The nodes the pre-filters refuse, together (None: none). A pre-filter that raises refuses none
        (its filter is then asked per node, and says the same or fails there)."""
        out: npt.NDArray[np.bool_] | None = None
        for prefilter in self._prefilters:
            try:
                mask = prefilter.refused(ssn, task)
            except Exception as exc:  # noqa: BLE001
                self._note(self._failed("node_prefilter", "prefilter", prefilter, exc), "prefilter")
                continue
            if mask is not None:
                out = mask if out is None else out | mask
        return out

    def prefilter_refuses(self, ssn: S, task: TaskState, idx: int) -> bool:
        """Whether a pre-filter refuses the node at `idx` of the session's nodes."""
        for prefilter in self._prefilters:
            try:
                mask = prefilter.refused(ssn, task)
            except Exception as exc:  # noqa: BLE001
                self._note(self._failed("node_prefilter", "prefilter", prefilter, exc), "prefilter")
                continue
            if mask is not None and bool(mask[idx]):
                return True
        return False

    # --- node scores ---------------------------------------------------------------------------------------
    def scores(
        self, ssn: S, task: TaskState, node_set: npt.NDArray[np.bool_], idle_fit: npt.NDArray[np.bool_]
    ) -> npt.NDArray[np.float64] | None:
        """The node scores summed (None: no scorer had an opinion). Raises `PluginError` when one raises."""
        score: npt.NDArray[np.float64] | None = None
        current: NodeScore[S] | None = None
        try:
            for current in self._scores:
                part = current.score(ssn, task, node_set, idle_fit)
                if part is not None:
                    score = part if score is None else score + part
        except Exception as exc:
            raise PluginError(self._failed("node_score", "score", current, exc)) from exc
        return score

    @property
    def has_device_orders(self) -> bool:
        return bool(self._device_orders)

    def device_score(self, used: float | None) -> float:
        """The GPU device orders' scores summed; one that raises adds 0."""
        total = 0.0
        for order in self._device_orders:
            try:
                total += order.device_score(used)
            except Exception as exc:  # noqa: BLE001
                self._note(self._failed("device_order", "device_score", order, exc), "device_score")
        return total

    # --- queues and quota ----------------------------------------------------------------------------------
    @property
    def has_queue_orders(self) -> bool:
        return bool(self._queue_orders)

    def compare_queues(self, ssn: S, a: QueueView, b: QueueView) -> int:
        """The first non-zero queue-order answer in chain order (0: none); one that raises answers 0."""
        for order in self._queue_orders:
            try:
                answer = order.compare(ssn, a, b)
            except Exception as exc:  # noqa: BLE001
                self._note(self._failed("queue_order", "compare", order, exc), "compare")
                continue
            if answer:
                return answer
        return 0

    @property
    def has_quota_checks(self) -> bool:
        return bool(self._quota_checks)

    def job_capacity(self, ssn: S, job: JobState, tasks: list[TaskState]) -> CapacityResult | None:
        """The first quota check's no, in chain order (None: all fit); one that raises says no with its
        name."""
        return self._first_no("job_capacity", ssn, job, tasks)

    def node_capacity(self, ssn: S, task: TaskState, node: NodeState) -> CapacityResult | None:
        """As `job_capacity`, for one pod on one node."""
        return self._first_no("node_capacity", ssn, task, node)

    def _first_no(self, method: str, *args: object) -> CapacityResult | None:
        for check in self._quota_checks:
            try:
                result: CapacityResult = getattr(check, method)(*args)
            except Exception as exc:  # noqa: BLE001
                return _capacity_failure(self._failed("quota_check", method, check, exc))
            if not result.ok:
                return result
        return None

    # --- victim filters ------------------------------------------------------------------------------------
    def victim_filters(self, ssn: S, action: VictimAction) -> VictimFilters[S] | None:
        """The victim filters that apply to `action` in this session, run together (None: none applies).
        A filter whose `applies` raises applies, and refuses every victim."""
        applying: list[VictimFilter[S]] = []
        broken = False
        for victim_filter in self.chains.victim_filters:
            try:
                applies = victim_filter.applies(ssn, action)
            except Exception as exc:  # noqa: BLE001
                self._note(self._failed("victim_filter", "applies", victim_filter, exc), "victim_filter")
                broken = True
                continue
            if applies:
                applying.append(victim_filter)
        if not applying and not broken:
            return None
        return VictimFilters(self, ssn, action, tuple(applying), broken=broken)

    # --- orders --------------------------------------------------------------------------------------------
    def _keys(self, point: str, method: str, tail: Callable[[X], OrderKey]) -> Callable[[X], OrderKey]:
        """One key function: the orders' parts concatenated, then the tail's; an order that raises gives
        `LAST` as its part."""
        named: list[tuple[str, Callable[[X], OrderKey]]] = []
        for name, plugin in self.chains.plugins:
            implementation = getattr(plugin, point)
            if implementation is not None:
                named.append((name, getattr(implementation, method)))
        parts = tuple(named)
        if not parts:
            return tail

        def key(item: X) -> OrderKey:
            out: tuple[Any, ...] = ()
            for name, part in parts:
                try:
                    out += part(item)
                except Exception as exc:  # noqa: BLE001
                    self._note(failure(name, method, exc), method)
                    out += (LAST,)
            return out + tail(item)

        if len(parts) == 1:
            ((only_name, only),) = parts

            def one(item: X) -> OrderKey:
                try:
                    return only(item) + tail(item)
                except Exception as exc:  # noqa: BLE001
                    self._note(failure(only_name, method, exc), method)
                    return (LAST, *tail(item))

            return one
        return key


class VictimFilters(Generic[S]):
    """The victim filters applying to one action in one session: every one must keep a victim and validate
    a scenario; one that raises does neither."""

    __slots__ = ("_action", "_broken", "_filters", "_runtime", "_ssn")

    def __init__(
        self,
        runtime: Runtime[S],
        ssn: S,
        action: VictimAction,
        filters: tuple[VictimFilter[S], ...],
        *,
        broken: bool = False,
    ) -> None:
        self._broken = broken
        """A filter's `applies` raised: no victim is kept, no scenario valid."""
        self._runtime = runtime
        self._ssn = ssn
        self._action: VictimAction = action
        self._filters = filters

    def keep(self, attacker: JobState, victim: JobState) -> bool:
        return self._every("keep", attacker, victim)

    def validate(self, attacker: JobState, victims: Sequence[tuple[JobState, Sequence[TaskState]]]) -> bool:
        return self._every("validate", attacker, victims)

    def _every(self, method: str, *args: object) -> bool:
        """Every filter's `method` says yes; one that raises says no and is named in the cycle's errors."""
        if self._broken:
            return False
        for victim_filter in self._filters:
            try:
                if not getattr(victim_filter, method)(self._ssn, self._action, *args):
                    return False
            except Exception as exc:  # noqa: BLE001
                self._fail(victim_filter, method, exc)
                return False
        return True

    def _fail(self, victim_filter: object, method: str, exc: Exception) -> None:
        runtime = self._runtime
        runtime._note(runtime._failed("victim_filter", method, victim_filter, exc), "victim_filter")


def _capacity_failure(status: Status) -> CapacityResult:
    return CapacityResult(False, status.reason, status.reason)


def _job_tail(job: JobState) -> OrderKey:
    return (job.creation_time, job.key)


def _task_tail(task: TaskState) -> OrderKey:
    return (task.creation_time, task.key)


def _pod_set_tail(member: SubGroupMember) -> OrderKey:
    return (member.name,)
