"""Every message this process sends to NATS, counted by what it is for: KV reads and writes per bucket,
JetStream publishes and requests per subject family, acknowledgements per stream, JetStream API calls.

Who calls it: `shared.bus.connection.connect` wraps each client's `publish` with `counting` (nats-py sends
everything through it: core publishes, requests, JetStream publishes, KV puts, gets and deletes, acks and
JetStream API calls), so the count sits where Kairos meets nats-py and no call site can forget it. The
runner (`shared.bus.service`) exposes the tally as Prometheus counters (`OperationsCollector`:
`kairos_bus_operations_total{family,operation}`) and in its answer to a health request (`as_counters`), which
the bench reads before and after its measured phase (`tools.bench.calls`) to report operations per pod.

`operation_of(subject, reply, headers)` is the pure part: a subject and what came with it -> (family,
operation), both bounded (never a key, pod, shard or replica name):

| subject                                  | family              | operation                             |
|------------------------------------------|---------------------|---------------------------------------|
| `$KV.<bucket>.<kind>.<...>`              | `kv.<bucket>.<kind>`| put, update (expected revision), delete, purge |
| `$JS.API.DIRECT.GET.KV_<bucket>.$KV...`  | `kv.<bucket>.<kind>`| get                                   |
| `$JS.API.STREAM.MSG.GET.KV_<bucket>`     | `kv.<bucket>.<kind>`| get (the key read from the payload)   |
| `$JS.API.<verb>...`                      | `jetstream.api`     | the verb (`CONSUMER.CREATE`, `STREAM.INFO`...) |
| `$JS.ACK.<stream>...`                    | `ack.<stream>`      | ack, nak, term, progress              |
| `kairos.<family>...`                     | `subject_family`'s  | publish (no reply), request (a reply) |
| anything else (a reply to an inbox)      | `reply`             | publish                               |

A JetStream publish is a request (it waits for the stream's acknowledgement), so on a stream's subject
`request` counts JetStream publishes and `publish` core ones.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client.metrics_core import CounterMetricFamily, Metric

from shared.telemetry.metrics import subject_family

__all__ = [
    "COUNTED",
    "OperationsCollector",
    "as_counters",
    "counting",
    "operation_of",
    "parse_counters",
    "tally",
]

KV_PREFIX = "$KV."
JS_API_PREFIX = "$JS.API."
JS_ACK_PREFIX = "$JS.ACK."
DIRECT_GET = "DIRECT.GET.KV_"
MSG_GET = "STREAM.MSG.GET.KV_"
EXPECTED_REVISION = "Nats-Expected-Last-Subject-Sequence"
"""The header nats-py's `update` (and `create`, with 0) sends: a compare-and-set write."""
KV_OPERATION = "KV-Operation"
"""The header of a KV delete or purge (`DEL`, `PURGE`)."""
MAX_KIND = 16
"""The longest key kind kept in a family's name (`kv.<bucket>.<kind>`)."""
COUNTER_PREFIX = "bus:"
"""How `as_counters` names an entry: `bus:<family>:<operation>`."""

_ACKS = {b"+ACK": "ack", b"-NAK": "nak", b"+TER": "term", b"+WPI": "progress"}
"""An acknowledgement's kind by its first four bytes (an empty one is an ack; a nak may carry a delay)."""
_KV_OPERATIONS = {"DEL": "delete", "PURGE": "purge"}

COUNTED: Counter[tuple[str, str]] = Counter()
"""This process's tally, (family, operation) -> messages sent; only ever grows."""

Publish = Callable[..., Awaitable[None]]


def operation_of(
    subject: str, reply: str = "", headers: Mapping[str, str] | None = None, payload: bytes = b""
) -> tuple[str, str]:
    """What a message sent on `subject` is for: (family, operation), as the module's table says."""
    if subject.startswith(KV_PREFIX):
        family = _kv_family(subject[len(KV_PREFIX) :])
        if headers:
            kv_op = headers.get(KV_OPERATION)
            if kv_op:
                return family, _KV_OPERATIONS.get(kv_op, kv_op.lower())
            if EXPECTED_REVISION in headers:
                return family, "update"
        return family, "put"
    if subject.startswith(JS_API_PREFIX):
        api = subject[len(JS_API_PREFIX) :]
        if api.startswith(DIRECT_GET):
            # DIRECT.GET.KV_<bucket>.$KV.<bucket>.<key> (nats-py's direct get names the key's subject).
            stream, _, key_subject = api[len(DIRECT_GET) :].partition(".")
            if key_subject.startswith(KV_PREFIX):
                return _kv_family(key_subject[len(KV_PREFIX) :]), "get"
            return f"kv.{stream}", "get"
        if api.startswith(MSG_GET):
            # STREAM.MSG.GET.KV_<bucket>, the key's subject in the JSON payload (`last_by_subj`).
            at = payload.find(b"$KV.")
            if at >= 0:
                end = payload.find(b'"', at)
                key = bytes(payload[at + len(KV_PREFIX) : end if end >= 0 else None])
                return _kv_family(key.decode("utf-8", "replace")), "get"
            return f"kv.{api[len(MSG_GET) :].partition('.')[0]}", "get"
        verb = ".".join(t for t in api.split(".")[:2] if t.isupper())
        return "jetstream.api", verb or "other"
    if subject.startswith(JS_ACK_PREFIX):
        stream = subject[len(JS_ACK_PREFIX) :].partition(".")[0]
        return f"ack.{stream}", _ACKS.get(bytes(payload[:4]), "ack")
    if subject.startswith("kairos."):
        return subject_family(subject), "request" if reply else "publish"
    return "reply", "publish"


def _kv_family(rest: str) -> str:
    """`<bucket>.<kind>.<...>` -> `kv.<bucket>.<kind>`: Kairos's keys begin with their kind (`pod`,
    `podgroup`, `node`, `claim`...); a first token that is not a short lowercase word is `other`, so the
    label stays bounded whatever a key holds."""
    bucket, _, key = rest.partition(".")
    kind = key.partition(".")[0]
    if not (0 < len(kind) <= MAX_KIND and kind.isascii() and kind.isalpha() and kind.islower()):
        kind = "other"
    return f"kv.{bucket}.{kind}"


def counting(publish: Publish, tally: Counter[tuple[str, str]] = COUNTED) -> Publish:
    """`publish` (a nats-py client's bound method), each message counted in `tally` first."""

    async def counted(
        subject: str, payload: bytes = b"", reply: str = "", headers: dict[str, str] | None = None
    ) -> None:
        tally[operation_of(subject, reply, headers, payload)] += 1
        await publish(subject, payload, reply, headers)

    return counted


def tally() -> dict[tuple[str, str], int]:
    """A copy of this process's counts."""
    return dict(COUNTED)


def as_counters(counts: Mapping[tuple[str, str], int] | None = None) -> dict[str, int]:
    """The counts as flat names (`bus:kv.kairos_state.pod:put`), for a heartbeat's `counters`."""
    source = COUNTED if counts is None else counts
    return {f"{COUNTER_PREFIX}{family}:{op}": n for (family, op), n in source.items()}


def parse_counters(counters: Mapping[str, int]) -> dict[tuple[str, str], int]:
    """`as_counters`' entries of a heartbeat's counters, back as (family, operation) -> count."""
    out: dict[tuple[str, str], int] = {}
    for name, n in counters.items():
        if name.startswith(COUNTER_PREFIX):
            family, _, op = name[len(COUNTER_PREFIX) :].rpartition(":")
            out[(family, op)] = n
    return out


class OperationsCollector:
    """`kairos_bus_operations_total{family,operation}` from a tally, read at scrape time."""

    def __init__(self, counts: Counter[tuple[str, str]] = COUNTED) -> None:
        self.counts = counts

    def collect(self) -> Iterable[Metric]:
        family = CounterMetricFamily(
            "kairos_bus_operations",
            "Messages this process sent to NATS, by what they are for (KV bucket, subject family, "
            "acknowledged stream, JetStream API) and operation.",
            labels=["family", "operation"],
        )
        for (name, op), n in sorted(self.counts.items()):
            family.add_metric([name, op], n)
        yield family
