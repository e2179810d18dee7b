"""Kairos's exception tree: every error Kairos raises on purpose, and how each is handled where it lands.

Raised by the decoders, validators and loaders (messages, configuration, Kubernetes objects, conformance
cases), by the clients of NATS and of the Kubernetes API, and by the binder's commit. Third-party errors
(msgspec, PyYAML, nats-py, aiohttp, NVML) are translated into these where they enter, so callers never see
them. Three places decide what an error means:

- a message handler's error becomes the message's fate in `shared.bus.middleware.fate_of`, the one
  function that maps an exception to ack, nak or term: a conflict or a fenced write is a decision already
  reported (ack); a malformed message or object can never succeed (term); a temporary error is retried
  after its `delay` (nak); anything else is retried after 2 s;
- the ``kairos`` command (`tools.cli.main`) prints a `KairosError` as one ``kairos: <message>`` line and
  exits with 2;
- a service process (`shared.bus.service.main`) prints one that reaches it, naming the service, and exits:
  with 2 while it reads its options, with 1 once it runs.

The whole tree; every subclass defined anywhere in Kairos is listed here (tests/unit/test_error_tree.py
keeps it so)::

    KairosError                  base of everything Kairos raises on purpose
    +-- InvalidObject            an input object is malformed: names kind, name, field, problem
    |   +-- DeviceAccessRefused  a pod sets NVIDIA_VISIBLE_DEVICES where blocked (services.state.webhook.device_access)
    +-- ConfigError              a configuration value is missing, unknown or out of range
    +-- ConflictError            a compare-and-set found another revision than the one read
    |   +-- LedgerConflict       a proposal's claims or reservations lost (services.binder.ledger)
    |   +-- DeviceConflict       a DRA device already held for another claim (services.binder.ledger)
    |   +-- PoolConflict         a cluster-wide pool's device already held (services.binder.pool_ledger)
    +-- MalformedMessage         a payload does not decode as its subject's message: names subject, problem
    +-- TemporaryError           worth retrying later (the bus shell naks with `delay`)
    |   +-- NoResponders         no service listens on a request's subject (shared.bus.client)
    |   +-- ReservationFailed    a reservation pod got no device in time, failed or vanished (services.binder.gpu_sharing_step)
    +-- FencedError              work from a leader whose lease term was superseded
    |   +-- LeaseLost            a write refused: the writer's lease is not held under its term (shared.bus.fence)
    +-- ApiError                 the Kubernetes API refused a call or could not be reached (shared.kubeapi.client)
    |   +-- Unreachable          a watch found no server to connect to (shared.kubeapi.informer)
    +-- ClusterRefused           the cluster refused a bind or an eviction (services.binder.cluster_client)
    |   +-- VolumeBindFailed     a pod's volumes could not be bound (services.binder.volumes)
    +-- Refused                  the simulated cluster will not carry out a request (services.state.sources.sim_source)
    +-- NvmlError                an NVML call failed (services.gpu_agent.nvml)
    |   +-- NvmlUnavailable      no NVML library or driver on this node (services.gpu_agent.nvml)
    +-- StartStoppedError        the stack was asked to stop before it was ready (tools.stack.supervisor)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "ConflictError",
    "FencedError",
    "InvalidObject",
    "KairosError",
    "MalformedMessage",
    "TemporaryError",
]


class KairosError(Exception):
    """Base class of every error Kairos raises deliberately."""


class InvalidObject(KairosError):  # noqa: N818 -- the tree's agreed name; it is an error by context
    """An input object is malformed or inconsistent.

    ``kind`` and ``name`` identify the object (``case``, ``'reclaim/x.yaml'``), ``field`` is the
    path of the offending value inside it in ``jobs[2].per_task.gpus`` form (empty when the whole
    object is at fault), ``problem`` says what is wrong with it.
    """

    def __init__(self, kind: str, name: str, field: str, problem: str) -> None:
        self.kind = kind
        self.name = name
        self.field = field
        self.problem = problem
        where = f"{field}: " if field else ""
        super().__init__(f"{kind} {name!r}: {where}{problem}")


class ConfigError(KairosError):
    """A configuration value is missing, unknown or out of range."""


class ConflictError(KairosError):
    """A compare-and-set on a node's ledger key found another revision than the one read."""

    def __init__(self, node: str, expected_revision: int, actual_revision: int) -> None:
        self.node = node
        self.expected_revision = expected_revision
        self.actual_revision = actual_revision
        super().__init__(
            f"node {node!r}: ledger revision {actual_revision}, expected {expected_revision}",
        )


class MalformedMessage(KairosError):  # noqa: N818 -- the tree's agreed name; it is an error by context
    """A payload that does not decode as its subject's message type (or has an unknown version)."""

    def __init__(self, subject: str, problem: str) -> None:
        self.subject = subject
        self.problem = problem
        super().__init__(f"malformed message on {subject!r}: {problem}")


class TemporaryError(KairosError):
    """Something that may work later (a dependency not ready, a timeout); retry after `delay` seconds."""

    def __init__(self, message: str, delay: float = 1.0) -> None:
        self.delay = delay
        super().__init__(message)


class FencedError(KairosError):
    """Work stamped with a lease term older than the shard's current one: its leader was superseded."""

    def __init__(self, shard: str, term: int, current: int) -> None:
        self.shard = shard
        self.term = term
        self.current = current
        super().__init__(f"shard {shard!r}: lease term {term} superseded by {current}")
