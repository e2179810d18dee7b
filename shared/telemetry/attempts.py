"""Where a podgroup's trace starts: the state service's record of scheduling attempts.

Used by `services.state.sources.kv_writer.StateWriter` (both sources, simulated and Kubernetes, write through it),
only while tracing is on. A podgroup's *attempt* begins when it gets a pending pod while it had none
(created with pending pods, a pod added, pods evicted back to Pending) and ends when it has no pending pod
left. At the start of an attempt the tracker opens a new trace with a `state.observe` span and keeps its
W3C `traceparent`; the writer stores it in the podgroup's KV record (`PodGroupRecord.traceparent`), where
the queue leader finds it. Pods that join while the attempt is open (a Job's pods arriving in several
flushes) join the same trace; so do the retries of later cycles.

Pure bookkeeping over the writer's changes (no I/O); the span is the only side effect.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from opentelemetry.context import Context

from shared.contracts.messages import STATE_RECORDS, PodGroupRecord, PodRecord, StateRecord
from shared.errors import MalformedMessage
from shared.model import Pod, PodGroup, PodStatus
from shared.telemetry import spans, tracing
from shared.telemetry.tracing import traceparent


class AttemptTracker:
    """Per podgroup: its pending pods and the traceparent of its open attempt."""

    def __init__(self, source: str) -> None:
        self.source = source
        """`sim` or `kube`: the `kairos.source` attribute of `state.observe`."""
        self.traceparents: dict[str, str] = {}
        """Podgroup key -> the traceparent of its open attempt."""
        self._groups: dict[str, tuple[str, PodGroup]] = {}
        """Podgroup key -> (its KV key, the podgroup)."""
        self._group_at: dict[str, str] = {}
        """KV key of a podgroup -> its key."""
        self._pod_in: dict[str, str] = {}
        """KV key of a pod -> the key of its podgroup."""
        self._pending: dict[str, set[str]] = {}
        """Podgroup key -> KV keys of its pending pods."""

    def seed(self, records: Mapping[str, StateRecord]) -> None:
        """Start from what KV holds: attempts open before a restart keep their trace."""
        self.observe(
            (
                (key, r.podgroup if isinstance(r, PodGroupRecord) else r.pod)
                for key, r in records.items()
                if isinstance(r, PodGroupRecord | PodRecord)
            ),
            start=False,
        )
        for key, record in records.items():
            if isinstance(record, PodGroupRecord) and record.traceparent:
                group = record.podgroup.key
                if self._pending.get(group) and self._group_at.get(key) == group:
                    self.traceparents[group] = record.traceparent

    def seed_encoded(self, stored: Mapping[str, bytes]) -> None:
        """`seed` from the encoded records (what the writer keeps); unreadable ones are left out."""
        records: dict[str, StateRecord] = {}
        for key, data in stored.items():
            if key.startswith(("pod.", "podgroup.")):
                with contextlib.suppress(MalformedMessage):
                    records[key] = STATE_RECORDS.decode(key, data)
        self.seed(records)

    def record(self, group: PodGroup) -> PodGroupRecord:
        """The KV record of `group`, with its open attempt's traceparent."""
        return PodGroupRecord(podgroup=group, traceparent=self.traceparents.get(group.key, ""))

    def observe(
        self, changes: Iterable[tuple[str, object | None]], *, start: bool = True
    ) -> dict[str, PodGroup]:
        """Apply a batch of changes (KV key, the object after it or None when removed). Returns the
        podgroups (by KV key) whose attempt began with this batch: their records must be written again,
        now carrying the new traceparent."""
        touched: set[str] = set()
        for key, obj in changes:
            if isinstance(obj, PodGroup):
                self._groups[obj.key] = (key, obj)
                self._group_at[key] = obj.key
                touched.add(obj.key)
            elif isinstance(obj, Pod):
                before = self._pod_in.get(key)
                if before is not None and before != obj.podgroup:
                    self._pending.get(before, set()).discard(key)
                    touched.add(before)
                self._pod_in[key] = obj.podgroup
                if obj.status == PodStatus.PENDING:
                    self._pending.setdefault(obj.podgroup, set()).add(key)
                else:
                    self._pending.get(obj.podgroup, set()).discard(key)
                touched.add(obj.podgroup)
            elif obj is None:
                if (group := self._pod_in.pop(key, None)) is not None:
                    self._pending.get(group, set()).discard(key)
                    touched.add(group)
                elif (group := self._group_at.pop(key, None)) is not None:
                    self._groups.pop(group, None)
                    self.traceparents.pop(group, None)
        began: dict[str, PodGroup] = {}
        for group in sorted(touched):
            pending = self._pending.get(group)
            if not pending:
                self._pending.pop(group, None)
                self.traceparents.pop(group, None)
                continue
            known = self._groups.get(group)
            if group in self.traceparents or known is None or not start:
                continue
            key, podgroup = known
            self.traceparents[group] = self._observe(podgroup, len(pending))
            began[key] = podgroup
        return began

    def _observe(self, group: PodGroup, pending: int) -> str:
        # A new trace whatever the caller's context: an attempt is a root.
        span = tracing.tracer().start_span(
            spans.STATE_OBSERVE,
            context=Context(),
            attributes={
                **spans.podgroup_attributes(group),
                spans.PODS_PENDING: pending,
                spans.MIN_MEMBER: sum(ps.min_available for ps in group.root.all_pod_sets()),
                spans.SOURCE: self.source,
            },
        )
        span.end()
        return traceparent(span.get_span_context())
