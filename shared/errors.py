"""Kairos's exception tree; every layer raises these and the shells map them to an outcome.

Raised by the loaders and validators (``tools.conformance.case``, later the config and message
decoders) and by the binder; caught by the shells: the ``kairos`` command turns a
``KairosError`` into one ``kairos: <message>`` line and exit code 2, the bus shell will turn
it into a message fate. Third-party errors (msgspec, PyYAML, nats) are translated into these at
the boundary, so callers never see them.

::

    KairosError                  base of everything Kairos raises on purpose
    +-- InvalidObject            an input object is malformed: names kind, name, field, problem
    +-- ConfigError              a configuration value is missing or unusable
    +-- ConflictError            a node's ledger revision moved under a compare-and-set (binder)
    +-- MalformedMessage         a payload does not decode as its subject's message: names subject, problem
    +-- TemporaryError           worth retrying later (the bus shell naks with `delay`)
    +-- FencedError              work from a queue leader whose lease term was superseded
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
