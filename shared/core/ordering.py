"""Which job an action handles next: queues ordered by fair share through the hierarchy, jobs by priority.

`JobsByQueue` is KAI's `JobsOrderByQueues`: a tree of heaps, queue nodes ordered by the proportion
comparison (using each subtree's best job) and jobs ordered by priority, gang state and age. Popping marks
the path for re-ordering, so queue order follows allocations made during the action. Both orders are
the session's plugin chains (`Session.chains`: queue orders, and the job order through `JobState.keys`). With
`victims=True` every order is reversed (the most over-served queue and the least important job first).

`depth` is KAI's ``MaxJobsQueueDepth`` (``Policy.queue_depth_per_action``, read by allocate, consolidation,
reclaim and preempt): each leaf queue holds at most that many jobs, the rest of its jobs are not in the
order at all (so the action never tries them this session); None holds them all, 0 none (no leaf is
made). When a push makes a leaf one too long, Kairos drops the leaf's *worst* job in job order, so a
leaf keeps its `depth` best jobs. KAI's bounded priority queue (``scheduler_util.PriorityQueue.Push``)
instead removes the heap's element at index `depth`, a leaf of the heap: the best job is always kept,
but which others are depends on the order the jobs were pushed (Go map order, so it varies between
runs); Kairos's choice is KAI's outcome when the jobs come best first. Victim orders are never bounded
(KAI builds them with ``QueueCapacityInfinite``).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Generic, TypeVar

from shared.core.proportion import QueueView, queue_view
from shared.core.tasks import JobState, OrderKey

if TYPE_CHECKING:
    from shared.core.proportion import QueueState
    from shared.core.session import Session

T = TypeVar("T")


class Heap(Generic[T]):
    """A binary heap over a `less` function, with KAI's `Fix(0)` for a head whose key changed."""

    def __init__(self, less: Callable[[T, T], bool]) -> None:
        self.less = less
        self.items: list[T] = []

    def __len__(self) -> int:
        return len(self.items)

    def push(self, item: T) -> None:
        self.items.append(item)
        self._up(len(self.items) - 1)

    def peek(self) -> T:
        return self.items[0]

    def pop(self) -> T:
        items = self.items
        last = items.pop()
        if not items:
            return last
        head = items[0]
        items[0] = last
        self._down(0)
        return head

    def fix(self, i: int) -> None:
        if not self._down(i):
            self._up(i)

    def _up(self, j: int) -> None:
        items = self.items
        while j > 0:
            i = (j - 1) // 2
            if i == j or not self.less(items[j], items[i]):
                break
            items[i], items[j] = items[j], items[i]
            j = i

    def _down(self, i0: int) -> bool:
        items = self.items
        n = len(items)
        i = i0
        while True:
            j1 = 2 * i + 1
            if j1 >= n:
                break
            j = j1
            j2 = j1 + 1
            if j2 < n and self.less(items[j2], items[j1]):
                j = j2
            if not self.less(items[j], items[i]):
                break
            items[i], items[j] = items[j], items[i]
            i = j
        return i > i0


def job_less(a: JobState, b: JobState) -> bool:
    """The session's job order (its job-order chain; KAI: priority, gang state, age, UID)."""
    return job_order_key(a) < job_order_key(b)


def job_order_key(job: JobState) -> OrderKey:
    """The job's key in its session's job order, cached until one of its pods changes status."""
    return job.cached("order_key", lambda: job.keys.job(job))


class _KeyedJobHeap:
    """The jobs of a leaf queue in job order, each keyed once when pushed.

    A job's order key only changes when its own pods change, which happens after it was popped (an
    action works on one job at a time), so keys taken at push time stay true while the job waits; plain
    tuple comparisons then replace a call into the order functions per comparison."""

    def __init__(self) -> None:
        self.items: list[tuple[OrderKey, JobState]] = []

    def __len__(self) -> int:
        return len(self.items)

    def push(self, job: object) -> None:
        assert isinstance(job, JobState)
        heapq.heappush(self.items, (job_order_key(job), job))

    def peek(self) -> JobState:
        return self.items[0][1]

    def pop(self) -> JobState:
        return heapq.heappop(self.items)[1]

    def drop_worst(self) -> None:
        """Remove the job last in job order (a bounded leaf one job too long)."""
        items = self.items
        worst = max(range(len(items)), key=lambda i: items[i][0])
        items[worst] = items[-1]
        items.pop()
        heapq.heapify(items)


class _QueueNode:
    __slots__ = ("children", "is_leaf", "needs_reorder", "parent", "queue")

    def __init__(self, queue: QueueState, is_leaf: bool, children: Heap[object] | _KeyedJobHeap) -> None:
        self.queue = queue
        self.is_leaf = is_leaf
        self.children = children
        self.needs_reorder = False
        self.parent: _QueueNode | None = None


class JobsByQueue:
    """Pending jobs (or victim jobs) in the order an action should consider them."""

    def __init__(self, ssn: Session, victims: bool = False, depth: int | None = None) -> None:
        if victims and depth is not None:
            raise ValueError("a victim order is never bounded (KAI: QueueCapacityInfinite)")
        if depth is not None and depth < 0:
            raise ValueError(f"depth {depth} is negative")
        self.ssn = ssn
        self.victims = victims
        self.depth = depth
        """At most this many jobs per leaf queue (None: all); see the module docstring."""
        self.roots: Heap[_QueueNode] = Heap(self._node_less)
        self.nodes: dict[str, _QueueNode] = {}
        self.popped: dict[str, list[JobState]] = {}
        self._views: dict[int, tuple[object, QueueView]] = {}

    def extend(self, jobs: Iterable[JobState]) -> None:
        for job in jobs:
            self.push(job)

    def extend_presorted(self, jobs: list[JobState]) -> None:
        """Add the jobs of one leaf queue that are already in this order's job order, best first.

        A sorted list is a valid heap, so a new leaf takes them without comparisons (the victim actions
        rebuild victim queues of thousands of jobs for every pending job).
        """
        if not jobs:
            return
        queue = self.ssn.queues.get(jobs[0].queue)
        if queue is None or not queue.is_leaf or queue.name in self.nodes or not self.victims:
            self.extend(jobs)
            return
        presorted: Heap[object] = Heap(self._job_less)
        presorted.items = list(jobs)
        leaf = _QueueNode(queue, True, presorted)
        self.nodes[queue.name] = leaf
        self._link(leaf)
        self._mark(leaf)

    def __bool__(self) -> bool:
        return len(self.roots) > 0

    def push(self, job: JobState) -> None:
        queue = self.ssn.queues.get(job.queue)
        if queue is None or not queue.is_leaf or self.depth == 0:
            return
        leaf = self.nodes.get(queue.name)
        new = leaf is None
        if leaf is None:
            jobs: Heap[object] | _KeyedJobHeap = Heap(self._job_less) if self.victims else _KeyedJobHeap()
            leaf = _QueueNode(queue, True, jobs)
            self.nodes[queue.name] = leaf
        leaf.children.push(job)
        if self.depth is not None and len(leaf.children) > self.depth:
            assert isinstance(leaf.children, _KeyedJobHeap)
            leaf.children.drop_worst()
        if new:
            self._link(leaf)
        self._mark(leaf)

    def _job_less(self, a: object, b: object) -> bool:
        assert isinstance(a, JobState)
        assert isinstance(b, JobState)
        return not job_less(a, b) if self.victims else job_less(a, b)

    def _link(self, node: _QueueNode) -> None:
        parent_name = node.queue.parent
        if parent_name is None or parent_name not in self.ssn.queues:
            if node.parent is None:
                self.roots.push(node)
            return
        parent = self.nodes.get(parent_name)
        new_parent = parent is None
        if parent is None:
            parent = _QueueNode(self.ssn.queues[parent_name], False, Heap(self._node_less_obj))
            self.nodes[parent_name] = parent
        if node.parent is None:
            node.parent = parent
            parent.children.push(node)
        if new_parent:
            self._link(parent)

    def _mark(self, node: _QueueNode | None) -> None:
        while node is not None:
            node.needs_reorder = True
            node = node.parent

    def _node_less_obj(self, a: object, b: object) -> bool:
        assert isinstance(a, _QueueNode)
        assert isinstance(b, _QueueNode)
        return self._node_less(a, b)

    def _node_less(self, a: _QueueNode, b: _QueueNode) -> bool:
        if len(a.children) == 0:
            return not self.victims
        if len(b.children) == 0:
            return self.victims
        runtime = self.ssn.plugins
        if not runtime.has_queue_orders:
            return False
        result = runtime.compare_queues(self.ssn, self._view(a), self._view(b)) < 0
        return not result if self.victims else result

    def _view(self, node: _QueueNode) -> QueueView:
        """The queue's comparison view, cached until an allocation or its head job changes."""
        job, victims = self._best(node)
        ssn = self.ssn
        key = (
            node.queue.version,
            id(job),
            job.version if job is not None else -1,
            tuple((id(v), v.version) for v in victims) if victims is not None else (),
        )
        cached = self._views.get(id(node))
        if cached is not None and cached[0] == key:
            return cached[1]
        req = ssn.job_init_request(job) if job is not None else None
        view = queue_view(node.queue, req, self._victims_alloc(victims), ssn.total)
        self._views[id(node)] = (key, view)
        return view

    def _victims_alloc(self, victims: list[JobState] | None) -> list[float] | None:
        if victims is None:
            return None
        total = [0.0, 0.0, 0.0]
        for job in victims:
            for t in job.tasks.values():
                if t.status.value in ("Allocated", "Bound", "Binding", "Running"):
                    v = self.ssn.accepted_quota(t)
                    for r in range(3):
                        total[r] += v[r]
        return total

    def _best(self, node: _QueueNode) -> tuple[JobState | None, list[JobState] | None]:
        while not node.is_leaf:
            child = node.children.peek()
            assert isinstance(child, _QueueNode)
            node = child
        head = node.children.peek()
        assert isinstance(head, JobState)
        if self.victims:
            return None, [*self.popped.get(node.queue.name, []), head]
        return head, None

    def drain(self) -> Iterator[JobState]:
        """Pop jobs in order until none is left; jobs pushed back meanwhile come out again."""
        while (job := self.pop()) is not None:
            yield job

    def pop(self) -> JobState | None:
        leaf = self._descend(self.roots)
        if leaf is None:
            return None
        job = leaf.children.pop()
        assert isinstance(job, JobState)
        if self.victims:
            self.popped.setdefault(leaf.queue.name, []).append(job)
        self._after_pop(leaf)
        return job

    def _descend(self, heap: Heap[_QueueNode] | Heap[object]) -> _QueueNode | None:
        while True:
            if len(heap) == 0:
                return None
            node = heap.peek()
            assert isinstance(node, _QueueNode)
            if node.needs_reorder:
                heap.fix(0)
                node.needs_reorder = False
                continue
            if len(node.children) == 0:
                return None
            if node.is_leaf:
                return node
            assert isinstance(node.children, Heap)
            heap = node.children

    def _after_pop(self, node: _QueueNode) -> None:
        if len(node.children) == 0:
            if node.parent is not None:
                node.parent.children.pop()
            else:
                self.roots.pop()
            del self.nodes[node.queue.name]
            if node.parent is not None:
                self._after_pop(node.parent)
            return
        self._mark(node)
