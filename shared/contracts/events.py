"""The public events users subscribe to on `kairos.events.>`, as JSON (any NATS client can read them).

Version 1. Each event is a msgspec Struct with a stable `type` tag; new fields only ever get defaults, so
a reader written today keeps working. docs/events.md and its JSON Schema are generated from these
structs (`python -m shared.contracts.schema`).
"""

from __future__ import annotations

import msgspec

from shared.errors import MalformedMessage

EVENTS_VERSION = 1


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    v: int = EVENTS_VERSION
    time: float
    """Seconds since the epoch when Kairos decided (the scheduler's clock)."""


class PodBound(_Event, frozen=True, kw_only=True, tag="pod-bound"):
    """A pod was bound to a node (as part of its whole gang)."""

    namespace: str
    pod: str
    podgroup: str
    queue: str
    node: str
    gpu_groups: list[str] = msgspec.field(default_factory=list)


class PodEvicted(_Event, frozen=True, kw_only=True, tag="pod-evicted"):
    """A pod was evicted: reclaimed by another queue, preempted, consolidated or a stale gang."""

    namespace: str
    pod: str
    podgroup: str
    node: str
    reason: str


class PodUnschedulable(_Event, frozen=True, kw_only=True, tag="pod-unschedulable"):
    """A podgroup stays pending; `message` is the answer to "why is my pod pending?"."""

    namespace: str
    podgroup: str
    queue: str
    message: str
    reasons: list[str] = msgspec.field(default_factory=list)


class PodGroupState(_Event, frozen=True, kw_only=True, tag="podgroup-state"):
    """A podgroup's phase changed: Pending, Pipelined, Running, Evicted."""

    namespace: str
    podgroup: str
    queue: str
    phase: str
    running: int = 0
    pending: int = 0


class QueueFairShare(_Event, frozen=True, kw_only=True, tag="queue-fair-share"):
    """A queue's fair share (and what it holds) after a recomputation: GPUs, CPU millicores, bytes."""

    queue: str
    parent: str | None
    fair_share: dict[str, float]
    allocated: dict[str, float]
    requested: dict[str, float]
    deserved: dict[str, float]
    allocated_non_preemptible: dict[str, float] = msgspec.field(default_factory=dict)
    usage: dict[str, float] = msgspec.field(default_factory=dict)
    """Time-based fair share: the queue's decayed usage over the shard's usage window as a fraction of the
    cluster's capacity (0 to 1), per resource, which shrank or grew its over-quota share with kValue. Empty
    when the shard's SchedulingShard has no usageDBConfig."""


class PodGroupAdmission(_Event, frozen=True, kw_only=True, tag="podgroup-admission"):
    """The quota gate's verdict on a podgroup with gated pods (the state service's `quota_gate` option
    gives every pod the scheduling gate `kairos.io/admission` at creation). `pods` are let in: their
    queue and every queue above it have room for them within their limits (and, for non-preemptible work,
    their quotas), the gang whole first, then one more pod at a time, and the state service lifts their
    gate. `admitted` says whether any is. The podgroup's other gated pods are held, `message` naming the
    queue and the resource. Published by the queue leader when a podgroup's verdict changes (another
    reason or message, or pods let in that the last verdict did not let in), and again after a leader
    change."""

    namespace: str
    podgroup: str
    queue: str
    """The podgroup's queue."""
    admitted: bool
    pods: list[str] = msgspec.field(default_factory=list)
    """Names of the gated pods let in (their gate is lifted)."""
    reason: str = ""
    """Why the other gated pods are held (empty when none is): `OverLimit`, `NonPreemptibleOverQuota`,
    `QueueDoesNotExist` or `NotLeafQueue`."""
    message: str = ""
    limited_by: str = ""
    """The queue whose limit or quota holds them: the podgroup's own or an ancestor."""


Event = PodBound | PodEvicted | PodUnschedulable | PodGroupState | QueueFairShare | PodGroupAdmission

EVENT_ENCODER = msgspec.json.Encoder()
EVENT_DECODER = msgspec.json.Decoder(Event)


class EventCodec:
    """Decodes a public event for a subscriber inside Kairos (the state service's write-back)."""

    def decode(self, subject: str, data: bytes) -> Event:
        try:
            event: Event = EVENT_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise MalformedMessage(subject, str(exc)) from exc
        if event.v != EVENTS_VERSION:
            raise MalformedMessage(subject, f"unknown event version {event.v}")
        return event


EVENTS = EventCodec()
