"""What a conformance run observed: the runner's output, in the README's JSON shape.

The runner (``tools.conformance.runner.run_case``) builds a :class:`CaseResult`; the judge
(``tools.conformance.judge``) compares it with the case; ``kairos conformance run --json``
prints it with :func:`encode_result`, and the bus path must produce the same bytes. Field order
is the README's, so the encoded JSON reads like its example. The structs are mutable on purpose:
the runner fills them in as the rounds go.
"""

from __future__ import annotations

import msgspec

__all__ = [
    "CaseResult",
    "Checkpoint",
    "ObservedJob",
    "ObservedNode",
    "ObservedTask",
    "RoundCounts",
    "decode_result",
    "encode_result",
]


class ObservedTask(msgspec.Struct):
    """A task (pod) at a checkpoint; quantities are sums of the pod's requests."""

    status: str
    node: str | None
    gpu_groups: list[str]
    gpus_requested: float
    gpus_accepted: float
    milli_cpu: float
    memory_bytes: float


class ObservedJob(msgspec.Struct):
    """A job at a checkpoint; ``fit_error_message`` uses SEMANTICS §8.1's format."""

    fit_error_message: str | None
    last_start_set: bool
    last_start_age_seconds: float | None
    tasks: dict[str, ObservedTask]


class ObservedNode(msgspec.Struct):
    """A node's GPU totals at a checkpoint (a shared GPU counts as one whole device)."""

    idle_gpus: float
    releasing_gpus: float


class Checkpoint(msgspec.Struct):
    """The state matched once: the rebuilt session (index 0) or one after-match round; for a
    single-session case, the one session right after its actions."""

    jobs: dict[str, ObservedJob]
    nodes: dict[str, ObservedNode]


class RoundCounts(msgspec.Struct):
    """Binds, evictions and pipelines committed in one scheduling round."""

    binds: int
    evictions: int
    pipelined: int


class CaseResult(msgspec.Struct):
    """One case's run: a count per round run, then ``1 + rounds_after_match`` checkpoints (one
    round and one checkpoint for a single-session case, SEMANTICS §13.4)."""

    name: str
    rounds: list[RoundCounts]
    checkpoints: list[Checkpoint]


_DECODER = msgspec.json.Decoder(CaseResult)


def encode_result(result: CaseResult) -> bytes:
    """Encode ``result`` as the README's one-line JSON object."""
    return msgspec.json.encode(result)


def decode_result(data: bytes | str) -> CaseResult:
    """Parse a runner's JSON output back; raises ``msgspec.ValidationError`` / ``DecodeError``."""
    return _DECODER.decode(data)
