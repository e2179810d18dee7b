"""Calls per pod over the bus: the Kubernetes API requests the simulated API server served and the messages
each service sent to NATS during a measured phase, each per bound pod and with what it is for.

Who calls it: `tools.bench.bus` starts a `CallCounter` just before its measured phase and stops it just
after, which adds `Record.calls`. The API side is kubesim's own count of the requests it serves (`GET
/kubesim/requests`, by client, verb, resource and status class); the NATS side is each service replica's
answer to a health request, whose counters hold what `shared.bus.operations` counted in that process (by KV
bucket, subject family, acknowledged stream or JetStream API, and operation), and its memory releases made
and put off (`Calls.releases`). Both are read before and after and subtracted, so the set-up and the stack's
start are left out.

`python -m tools.bench.calls REPORT.json` prints the tables of a written report (`calls_table`).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from shared.bus.operations import parse_counters
from shared.contracts import subjects as s
from shared.contracts.messages import Heartbeat

__all__ = [
    "API_PURPOSES",
    "BUS_PURPOSES",
    "ApiCalls",
    "BusOperations",
    "CallCounter",
    "Calls",
    "MemoryReleases",
    "api_writes",
    "calls_table",
]

DISCOVERY_S = 10.0
"""How long the counter waits for a heartbeat from every replica it expects before it counts without the
missing ones (and says so in `Calls.missing`)."""
REQUEST_TIMEOUT_S = 5.0
RELEASED, DEFERRED = "memory_releases", "memory_releases_deferred"
"""The service runner's heartbeat counters of memory releases made and put off (`shared.bus.service`)."""

API_PURPOSES: dict[tuple[str, str], str] = {
    ("create", "pods"): "the workload's pods (the benchmark)",
    ("create", "podgroups"): "the workload's PodGroups (the benchmark)",
    ("create", "pods/binding"): "binder: binding a pod to its node",
    ("patch", "pods/status"): "state: a pod's conditions (PodScheduled) written back",
    ("patch", "pods"): "a pod's labels or annotations (state's pod-grouper, binder's GPU groups)",
    ("patch", "queues/status"): "state: a Queue's status (allocated, requested, fair share)",
    ("list", "configmaps"): "a ConfigMap list",
    ("create", "events"): "state: a Kubernetes Event (Scheduled, Unschedulable, ...)",
    ("patch", "events"): "state: an Event seen again (its count raised)",
    ("patch", "podgroups/status"): "state: a PodGroup's status (phase, conditions) written back",
    ("patch", "podgroups"): "state: a PodGroup's labels or annotations",
    ("get", "podgroups"): "state's admission webhook: the pod's PodGroup",
    ("get", "pods"): "one pod read",
    ("list", "pods"): "pods listed (pod-grouper, informer resync)",
    ("create", "bindrequests"): "binder: the BindRequest of a pod",
    ("patch", "bindrequests/status"): "binder: a BindRequest's status",
    ("watch", "pods"): "a watch of pods (re)opened",
    ("create", "persistentvolumeclaims"): "the workload's claims (the benchmark)",
    ("get", "persistentvolumeclaims"): "binder: a pod's claim read before binding its volume",
    ("patch", "persistentvolumeclaims"): "binder: a provisioned claim's selected-node annotation",
    ("get", "persistentvolumes"): "binder: a local volume read before it is bound to its claim",
    ("update", "persistentvolumes"): "binder: a local volume bound to its claim (claimRef)",
    ("get", "nodes"): "binder: the chosen node's labels (volume topology)",
    ("get", "resourceclaims"): "binder: a pod's ResourceClaim read before its allocation is written",
    ("update", "resourceclaims/status"): "binder: a ResourceClaim's allocation and reservedFor",
}
"""What each kind of API call is for, as far as Kairos makes it (kubesim's own controllers and the
benchmark's creates are the rest)."""

BUS_PURPOSES: dict[tuple[str, str], str] = {
    ("kv.kairos_state.pod", "update"): "state: a pod's record written (under the source's fence)",
    ("kv.kairos_state.podgroup", "update"): "state: a podgroup's record written (under the source's fence)",
    ("kv.kairos_state.node", "update"): "state: a node's record written (under the source's fence)",
    ("kv.kairos_state.queue", "update"): "state: a queue's record written (under the source's fence)",
    ("kv.kairos_state.volume", "update"): "state: a claim's, volume's, class's or CSINode's record written",
    ("kv.kairos_state.dra", "update"): "state: a ResourceClaim's, slice's or DeviceClass's record written",
    ("kv.kairos_state.pod", "delete"): "state: a pod's record removed",
    ("kv.kairos_state.fence", "get"): "the source's write fence read",
    ("kv.kairos_ledger.node", "update"): "a node's ledger compare-and-set (binder: reserve; state: release)",
    ("kv.kairos_ledger.node", "get"): "a node's ledger read before its compare-and-set",
    ("kv.kairos_ledger.claim", "update"): "binder: a pod's claim on a node",
    ("kv.kairos_ledger.claim", "create"): "binder: a pod's claim on a node",
    ("kv.kairos_ledger.claim", "get"): "a pod's claim read",
    ("kv.kairos_ledger.claim", "delete"): "a pod's claim removed",
    ("kv.kairos_leases.lease", "update"): "a lease renewed",
    ("kairos.work", "request"): "queue: a work item (JetStream publish) for placement",
    ("kairos.proposals", "request"): "placement: a bind proposal (JetStream publish) for the binder",
    ("kairos.outcomes", "request"): "binder: a proposal's outcome (JetStream publish)",
    ("kairos.events.pod-bound", "request"): "binder: the pod-bound public event (JetStream publish)",
    (
        "kairos.events.podgroup-state",
        "request",
    ): "binder: the podgroup-state public event (JetStream publish)",
    ("kairos.events.queue-fair-share", "request"): "queue: a queue's fair share event (JetStream publish)",
    ("kairos.stamps", "publish"): "binder: the stamps of bound pods for the state service",
    ("kairos.health", "publish"): "the replica's heartbeat",
    ("reply", "publish"): "a reply to a request (health, why, cluster calls)",
    ("jetstream.api", "CONSUMER.MSG"): "a pull consumer's fetch",
    ("jetstream.api", "CONSUMER.INFO"): "a consumer's info read",
    ("jetstream.api", "CONSUMER.CREATE"): "a consumer made (ordered consumers are made again after a gap)",
}
"""What each kind of NATS message is for; an acknowledgement (`ack.<stream>`) is a consumer's of that
stream's messages."""


class ApiCalls(msgspec.Struct, kw_only=True, frozen=True):
    """Kubernetes API requests of one kind during the measured phase."""

    client: str
    """The first word of the User-Agent (`OpenAPI-Generator`: kubernetes-asyncio, the services; `Python`:
    aiohttp, the benchmark; `kubesim`: its own controllers, none of which go over HTTP)."""
    verb: str
    resource: str
    """A plural, or `plural/subresource`."""
    status: str
    """The answers' status class: `2xx`, `4xx`, `5xx`; `2xx unchanged` for a patch or update that left its
    object as it was (a call that need not have been made)."""
    count: int
    per_pod: float
    purpose: str = ""


class BusOperations(msgspec.Struct, kw_only=True, frozen=True):
    """Messages of one kind one service sent to NATS during the measured phase (its replicas summed)."""

    service: str
    family: str
    operation: str
    count: int
    per_pod: float
    purpose: str = ""


class MemoryReleases(msgspec.Struct, kw_only=True, frozen=True):
    """One service replica's memory releases during the measured phase (`shared.memory_release`): each is a
    full collection that holds its event loop, so a release inside a phase weighs on that run's figures."""

    replica: str
    released: int
    deferred: int
    """Releases put off because the replica was busy."""


class Calls(msgspec.Struct, kw_only=True, omit_defaults=True):
    """A measured phase's calls; `per_pod` is over `pods` bound measured pods."""

    pods: int
    api: list[ApiCalls] = msgspec.field(default_factory=list)
    bus: list[BusOperations] = msgspec.field(default_factory=list)
    releases: list[MemoryReleases] = msgspec.field(default_factory=list)
    """One per replica counted; reports written before this field have none."""
    missing: list[str] = msgspec.field(default_factory=list)
    """Services whose replicas did not all answer (their operations are not counted)."""


class _Requests(msgspec.Struct):
    requests: list[dict[str, Any]]


READS = frozenset({"get", "list", "watch"})


async def api_writes(http: Any) -> int:
    """How many writes (any verb but get, list and watch) the simulated API server has served so far, from
    every client; `http` is an aiohttp session whose base URL is that server. The bench's set-up waits for
    this to stop rising, so that the services' write-back of the set-up is not counted as measured work."""
    async with http.get("/kubesim/requests") as resp:
        body = msgspec.json.decode(await resp.read(), type=_Requests)
    return sum(int(row["count"]) for row in body.requests if row["verb"] not in READS)


_HEARTBEAT = msgspec.msgpack.Decoder(Heartbeat)
ApiKey = tuple[str, str, str, str]
BusKey = tuple[str, str, str]


class CallCounter:
    """Counts between `start()` and `stop(pods)`; see the module docstring."""

    def __init__(self, bus: Any, http: Any, replicas: Mapping[str, int]) -> None:
        self.bus = bus
        """A `shared.bus.connection.Bus` (its `nc` asks the replicas)."""
        self.http = http
        """An aiohttp session whose base URL is the simulated API server."""
        self.replicas = dict(replicas)
        self.seen: dict[str, set[str]] = {}
        """Service -> replica ids whose heartbeats arrived."""
        self._api: Counter[ApiKey] = Counter()
        self._bus: Counter[BusKey] = Counter()
        self._releases: Counter[tuple[str, str]] = Counter()
        self.missing: list[str] = []

    async def start(self) -> None:
        await self._discover()
        self._api = await self._api_counts()
        self._bus, self._releases = await self._bus_counts()

    async def stop(self, pods: int) -> Calls:
        api = await self._api_counts()
        ops, releases = await self._bus_counts()
        api.subtract(self._api)
        ops.subtract(self._bus)
        releases.subtract(self._releases)
        per = max(pods, 1)
        return Calls(
            pods=pods,
            api=[
                ApiCalls(
                    client=client,
                    verb=verb,
                    resource=resource,
                    status=status,
                    count=n,
                    per_pod=round(n / per, 3),
                    purpose=API_PURPOSES.get((verb, resource), ""),
                )
                for (client, verb, resource, status), n in api.most_common()
                if n > 0
            ],
            bus=[
                BusOperations(
                    service=service,
                    family=family,
                    operation=op,
                    count=n,
                    per_pod=round(n / per, 3),
                    purpose=_bus_purpose(family, op),
                )
                for (service, family, op), n in sorted(ops.items(), key=lambda kv: (kv[0][0], -kv[1]))
                if n > 0
            ],
            releases=[
                MemoryReleases(
                    replica=replica,
                    released=releases[(replica, RELEASED)],
                    deferred=releases[(replica, DEFERRED)],
                )
                for replica in sorted({replica for replica, _ in releases})
            ],
            missing=sorted(self.missing),
        )

    async def _discover(self) -> None:
        """Wait for a heartbeat from every expected replica (up to `DISCOVERY_S`)."""
        complete = asyncio.Event()

        async def on_beat(msg: Any) -> None:
            try:
                beat = _HEARTBEAT.decode(msg.data)
            except (msgspec.DecodeError, msgspec.ValidationError):
                return
            self.seen.setdefault(beat.service, set()).add(beat.replica)
            if all(len(self.seen.get(svc, ())) >= n for svc, n in self.replicas.items()):
                complete.set()

        sub = await self.bus.nc.subscribe(s.HEALTH_WILDCARD, cb=on_beat)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(complete.wait(), DISCOVERY_S)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.missing = [svc for svc, n in self.replicas.items() if len(self.seen.get(svc, ())) < n]

    async def _api_counts(self) -> Counter[ApiKey]:
        async with self.http.get("/kubesim/requests") as resp:
            body = msgspec.json.decode(await resp.read(), type=_Requests)
        out: Counter[ApiKey] = Counter()
        for row in body.requests:
            out[(row["client"], row["verb"], row["resource"], row["status"])] += int(row["count"])
        return out

    async def _bus_counts(self) -> tuple[Counter[BusKey], Counter[tuple[str, str]]]:
        """Each service's operations (its replicas summed), and each replica's memory release counters."""
        out: Counter[BusKey] = Counter()
        releases: Counter[tuple[str, str]] = Counter()
        for service, replicas in sorted(self.seen.items()):
            if service not in self.replicas or service in self.missing:
                continue
            for replica in sorted(replicas):
                try:
                    msg = await self.bus.nc.request(
                        s.health(service, replica), b"", timeout=REQUEST_TIMEOUT_S
                    )
                    beat = _HEARTBEAT.decode(msg.data)
                except Exception:  # noqa: BLE001 -- a replica gone is reported, the run goes on
                    self.missing.append(service)
                    break
                for (family, op), n in parse_counters(beat.counters).items():
                    out[(service, family, op)] += n
                for name in (RELEASED, DEFERRED):
                    releases[(replica, name)] += beat.counters.get(name, 0)
        return out, releases


def _bus_purpose(family: str, op: str) -> str:
    if family.startswith("ack."):
        return f"a consumer's {op} of a message of stream {family[4:]}"
    return BUS_PURPOSES.get((family, op), "")


def calls_table(calls: Calls) -> list[str]:
    """The tables `kairos bench` prints: API calls, then NATS messages per service, per bound pod; then each
    replica's memory releases in the phase."""
    lines = [f"Kubernetes API calls per bound pod ({calls.pods:,} pods):"]
    lines += [
        f"  {c.per_pod:>8.3f}  {c.verb:<7} {c.resource:<24} {c.status:<14} {c.client:<18} {c.purpose}"
        for c in calls.api
    ]
    lines.append("NATS messages sent per bound pod, per service:")
    lines += [
        f"  {o.per_pod:>8.3f}  {o.service:<10} {o.family:<28} {o.operation:<16} {o.purpose}"
        for o in calls.bus
    ]
    if calls.missing:
        lines.append(f"  (not counted: {', '.join(calls.missing)}: a replica did not answer)")
    if calls.releases:
        made = ", ".join(f"{r.replica} {r.released} ({r.deferred} put off)" for r in calls.releases)
        lines.append(f"Memory releases in the phase (a full collection each), per replica: {made}")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    """Print the calls tables of each bus record of a report written by `kairos bench --json`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m tools.bench.calls REPORT.json\n")
        return 2
    report = msgspec.json.decode(Path(args[0]).read_bytes())
    for record in report.get("records", []):
        if record.get("calls") is None:
            continue
        calls = msgspec.convert(record["calls"], Calls)
        sys.stdout.write(f"{record['workload']} ({record['mode']}, {record['nodes']:,} nodes):\n")
        sys.stdout.write("\n".join(calls_table(calls)) + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
