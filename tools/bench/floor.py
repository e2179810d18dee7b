"""The library floor: what the messages each service sends and receives per pod cost in the libraries alone.

Who calls it: `python -m tools.bench.floor REPORT.json` after `kairos bench --mode bus --json REPORT.json`
(docs/performance.md, "The tenth stop"). It measures on this machine what one message costs the process that
handles it (`measure`: CPU time of this process only, `time.process_time`, each peer in a process of its
own), then multiplies those costs by the calls a bus record counted per bound pod (`Record.calls`,
`tools.bench.calls`) and prints, per service, the floor beside the CPU per pod the record measured
(`floor`). The floor is what no change to Kairos's own code can take below while it sends these messages
through these libraries: aiohttp (under kubernetes-asyncio, `shared.kubeapi.client.Kube.request`) and
nats-py.

What is counted, per bound pod:

- each Kubernetes API write a service makes (the calls table's rows whose purpose names the service) at
  `UnitCosts.api_write_us`, and for the state service one admission review per pod created at
  `webhook_us` (the reviews are kubesim's calls to the webhook, which the calls table does not count);
- each JetStream publish a service makes (a KV put or update, a public event, a work item, a proposal, an
  outcome, a KV read, which is a request too) at `publish_us`, the state bucket's at `publish_fenced_us` (the
  write fence's two headers ride with every record); each ack and core publish at `ack_us`;
- each KV record written, received again by every service replica, which all follow the state and ledger
  buckets (`shared.bus.replica.StateReplica`), at `receipt_fenced_us` for the state bucket's and
  `receipt_us` for the ledger's; and each stream message a service acks, received once, at `receipt_us`;
- each API write that changes a pod, by anyone over HTTP, read back by every state replica's informers as a
  watch event, at `watch_event_us`.

Left out, so the floor is a lower bound: the PodGroups' watch events, those of kubesim's own controllers (a
pod started), the messages a service receives that are neither KV records nor acknowledged stream messages
(the requests it answers, the replies it gets), and everything Kairos does with a message once the library
has handed it over.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any

import aiohttp
import msgspec
import nats
from aiohttp import web

from shared import event_loop
from shared.contracts import subjects as s
from shared.kube import wire
from shared.kubeapi.client import connect
from tools.bench.calls import READS, Calls
from tools.bench.report import SERVICES, process_group
from tools.stack.nats_server import start_nats_server

__all__ = ["Floor", "UnitCosts", "floor", "floor_table", "measure"]

IN_FLIGHT_API = 16
"""Requests in flight at once, as the write-back's and the binder's bounded fan-outs send them."""
IN_FLIGHT_PUBLISH = 200
"""JetStream publishes awaiting their acknowledgements at once, as a flush's fenced puts go out together."""
FENCED_BUCKET = s.STATE_BUCKET
"""The bucket whose records carry the write fence's headers (`shared.bus.fence`)."""
WATCHED_BUCKETS = (s.STATE_BUCKET, s.LEDGER_BUCKET)
"""The buckets every service replica follows (`shared.bus.replica.StateReplica`)."""
PUBLISHES = frozenset({"put", "update", "create", "delete", "purge", "request", "get"})
"""Operations that are a JetStream publish or request awaiting an answer."""
ONE_WAY = frozenset({"ack", "nak", "term", "publish"})
WATCHED_RESOURCES = frozenset({"pods", "pods/binding", "pods/status"})
"""Resources whose every write that changes an object is a watch event of a pod for each state replica's
informers (a write answered `2xx unchanged` is none). PodGroups' events are left out: their objects are not
the pod `watch_event_us` is measured with."""


class UnitCosts(msgspec.Struct, frozen=True, kw_only=True):
    """CPU microseconds one message costs the process that sends or receives it (`measure`)."""

    api_write_us: float
    """A Kubernetes API write through `Kube.request` (aiohttp), `IN_FLIGHT_API` at once, client side."""
    webhook_us: float
    """An aiohttp server answering a POST with a constant (the admission webhook's library part)."""
    publish_fenced_us: float
    """A JetStream publish and its acknowledgement, with the write fence's two headers."""
    publish_us: float
    """The same without headers."""
    receipt_fenced_us: float
    """A stored message with the fence's headers, received by an ordered consumer (a KV watch)."""
    receipt_us: float
    """The same without headers."""
    ack_us: float
    """A core NATS publish that awaits no answer (an ack)."""
    watch_event_us: float
    """A pod's watch event read from a streamed HTTP answer (aiohttp) and decoded as the informers and the
    mirror decode it (the event, then the pod into `shared.kube.wire`'s structs)."""


class Floor(msgspec.Struct, frozen=True, kw_only=True):
    """One service's floor beside what the record measured, CPU ms per bound pod."""

    service: str
    replicas: int
    floor_ms: float
    """The service's replicas together."""
    measured_ms: float | None
    """The replicas together, from the record's `cpu_ms_per_pod`; None where the record has none."""
    parts: dict[str, float]
    """The floor's parts, ms per pod: `api`, `webhook`, `publish`, `one_way`, `receipt`, `watch`."""

    @property
    def per_replica_ms(self) -> float:
        """One replica's share: the replicas divide the writes and each receives its own copy of every
        record, so each spends the whole over the count."""
        return self.floor_ms / self.replicas


def _service_of_purpose(purpose: str) -> str | None:
    head = purpose.split(":", 1)[0].strip()
    return head if head in SERVICES else None


def floor(
    calls: Calls, replicas: Mapping[str, int], measured: Mapping[str, float], units: UnitCosts
) -> list[Floor]:
    """Each service's floor (see the module docstring) from a record's `calls`, its `replicas` per service,
    and its measured CPU ms per bound pod per process (`cpu_ms_per_pod`, keyed `state-0`, ...)."""
    parts: dict[str, dict[str, float]] = {
        svc: dict.fromkeys(("api", "webhook", "publish", "one_way", "receipt", "watch"), 0.0)
        for svc in SERVICES
    }
    for row in calls.api:
        service = _service_of_purpose(row.purpose)
        if service is not None and row.client != "Python":
            parts[service]["api"] += row.per_pod * units.api_write_us
        if (row.verb, row.resource) == ("create", "pods") and row.status.startswith("2"):
            parts["state"]["webhook"] += row.per_pod * units.webhook_us
        if row.verb not in READS and row.resource in WATCHED_RESOURCES and row.status == "2xx":
            parts["state"]["watch"] += replicas.get("state", 0) * row.per_pod * units.watch_event_us
    written: dict[str, float] = dict.fromkeys(WATCHED_BUCKETS, 0.0)
    for op in calls.bus:
        if op.service not in parts:
            continue
        bucket = op.family.split(".")[1] if op.family.startswith("kv.") else None
        if op.operation in PUBLISHES:
            fenced = bucket == FENCED_BUCKET and op.operation != "get"
            parts[op.service]["publish"] += op.per_pod * (
                units.publish_fenced_us if fenced else units.publish_us
            )
            if bucket in written and op.operation != "get":
                written[bucket] += op.per_pod
        elif op.operation in ONE_WAY:
            parts[op.service]["one_way"] += op.per_pod * units.ack_us
            if op.family.startswith("ack."):
                parts[op.service]["receipt"] += op.per_pod * units.receipt_us
    for service in SERVICES:
        n = replicas.get(service, 0)
        parts[service]["receipt"] += n * (
            written[FENCED_BUCKET] * units.receipt_fenced_us + written[s.LEDGER_BUCKET] * units.receipt_us
        )
    out: list[Floor] = []
    for service in SERVICES:
        n = replicas.get(service, 0)
        if n == 0:
            continue
        mine = [ms for process, ms in measured.items() if process_group(process) == service]
        ms_parts = {name: round(us / 1000, 4) for name, us in parts[service].items()}
        out.append(
            Floor(
                service=service,
                replicas=n,
                floor_ms=round(sum(ms_parts.values()), 4),
                measured_ms=round(sum(mine), 4) if mine else None,
                parts=ms_parts,
            )
        )
    return out


def floor_table(floors: Sequence[Floor], units: UnitCosts) -> list[str]:
    """The lines `python -m tools.bench.floor` prints for one record."""
    lines = [
        "unit costs (CPU us per message, this machine): "
        + ", ".join(f"{name} {value:.1f}" for name, value in msgspec.structs.asdict(units).items()),
        (
            f"  {'service':<10} {'replicas':>8} {'floor ms/pod':>12} {'per replica':>11} {'measured':>9}"
            f" {'floor share':>11}   parts (ms/pod)"
        ),
    ]
    for f in floors:
        measured = "-" if f.measured_ms is None else f"{f.measured_ms:.2f}"
        share = "-" if not f.measured_ms else f"{f.floor_ms / f.measured_ms:.0%}"
        parts = ", ".join(f"{name} {ms:.3f}" for name, ms in f.parts.items() if ms)
        lines.append(
            f"  {f.service:<10} {f.replicas:>8} {f.floor_ms:>12.3f} {f.per_replica_ms:>11.3f} {measured:>9}"
            f" {share:>11}   {parts}"
        )
    total = sum(f.floor_ms for f in floors)
    measured_total = sum(f.measured_ms or 0.0 for f in floors)
    lines.append(f"  {'services':<10} {'':>8} {total:>12.3f} {'':>11} {measured_total:>9.2f}")
    return lines


# --- measuring ---------------------------------------------------------------------------------------------

_PEER_SERVER = """
import asyncio, sys
from aiohttp import web
line, n, chunk = sys.stdin.buffer.readline(), int(sys.argv[1]), int(sys.argv[2])
async def main():
    async def answer(request):
        await request.read()
        return web.Response(status=201, body=b'{}', content_type='application/json')
    async def watch(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for start in range(0, n, chunk):
            await response.write(line * min(chunk, n - start))
        await response.write_eof()
        return response
    app = web.Application()
    app.router.add_get('/watch', watch)
    app.router.add_route('*', '/{tail:.*}', answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, '127.0.0.1', 0)
    await site.start()
    print(runner.addresses[0][1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
asyncio.run(main())
"""
"""A stand-in API server in a process of its own: `GET /watch` streams one watch of `n` copies of the event
line it is given on its standard input, `chunk` lines at a time (kubesim writes a busy moment's events in one
chunk); every other request is answered 201 with an empty object. It prints its port and runs until its
standard input closes."""

_POSTING_CLIENT = """
import asyncio, sys, aiohttp
async def main(url, n, width):
    async with aiohttp.ClientSession() as session:
        gate = asyncio.Semaphore(width)
        async def one():
            async with gate:
                async with session.post(url, data=b'{"kind":"AdmissionReview"}') as r:
                    await r.read()
        await one()
        await asyncio.gather(*(one() for _ in range(n)))
asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
"""
"""A client in a process of its own posting one request, then `n`, `width` at once."""

WATCH_CHUNK = 16
"""Watch events `_PEER_SERVER` writes at a time."""

BENCH_POD: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "Pod",
    "metadata": {
        "name": "job-000001-0",
        "namespace": "bench",
        "uid": "3f1c2a7e-9b0d-4c55-8e21-7a6d5b4c3e2f",
        "resourceVersion": "123456",
        "creationTimestamp": "2026-12-06T07:00:00Z",
        "labels": {"kai.scheduler/queue": "team-1"},
        "annotations": {"pod-group-name": "job-000001"},
    },
    "spec": {
        "schedulerName": "kai-scheduler",
        "nodeName": "node-01234",
        "containers": [
            {
                "name": "main",
                "image": "bench",
                "resources": {"requests": {"cpu": "1", "memory": "1Gi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Always",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
            {
                "key": "node.kubernetes.io/unreachable",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            },
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    },
    "status": {
        "phase": "Pending",
        "qosClass": "Burstable",
        "conditions": [
            {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-06T07:00:01Z"}
        ],
    },
}
"""A pod as the benchmark creates it (`tools.bench.manifests.pod_manifest`), with what an API server adds,
bound: what a watch event of SchedulingBasic carries."""


class _WatchEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


@contextlib.asynccontextmanager
async def _peer_server(line: bytes = b"\n", n: int = 0) -> AsyncIterator[int]:
    """`_PEER_SERVER` started with the watch event `line` to stream `n` times; its port. Stopped on exit."""
    peer = subprocess.Popen(  # noqa: ASYNC220 -- started once, read once; the measurement is after it
        [sys.executable, "-c", _PEER_SERVER, str(n), str(WATCH_CHUNK)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert peer.stdin is not None
    assert peer.stdout is not None
    try:
        peer.stdin.write(line)
        peer.stdin.flush()
        yield int(await asyncio.to_thread(peer.stdout.readline))
    finally:
        with contextlib.suppress(OSError):
            peer.stdin.close()
        peer.terminate()
        await asyncio.to_thread(peer.wait)
        peer.stdout.close()


async def _watch_event_us(n: int) -> float:
    line = msgspec.json.encode({"type": "MODIFIED", "object": BENCH_POD}) + b"\n"
    async with _peer_server(line, n) as port:
        envelope = msgspec.json.Decoder(_WatchEvent)
        seen = 0

        async def read() -> None:
            nonlocal seen
            url = f"http://127.0.0.1:{port}/watch"
            async with aiohttp.ClientSession() as session, session.get(url) as answer:
                buffer = b""
                async for chunk in answer.content.iter_any():
                    buffer += chunk
                    *lines, buffer = buffer.split(b"\n")
                    for one in lines:
                        if one.strip():
                            event = envelope.decode(one)
                            wire.decode_pod(event.object)
                            seen += 1

        cost = await _cpu_per(n, read)
    if seen != n:
        raise RuntimeError(f"the watch stream gave {seen} events of {n}")
    return cost


_KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: floor, cluster: {server: "http://127.0.0.1:%d"}}]
users: [{name: floor, user: {}}]
contexts: [{name: floor, context: {cluster: floor, user: floor}}]
current-context: floor
"""


async def _cpu_per(n: int, work: Callable[[], Awaitable[None]]) -> float:
    """CPU microseconds of this process per message while `work` handles `n` of them."""
    started = time.process_time()
    await work()
    return (time.process_time() - started) * 1e6 / max(n, 1)


async def _api_write_us(n: int, directory: Path) -> float:
    async with _peer_server() as port:
        config = directory / "kubeconfig"
        config.write_text(_KUBECONFIG % port)
        kube = await connect(str(config))
        try:
            gate = asyncio.Semaphore(IN_FLIGHT_API)
            body = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "floor"}, "reason": "Scheduled"}

            async def one() -> None:
                async with gate:
                    await kube.request("event", "POST", "/api/v1/namespaces/default/events", body)

            await kube.request("event", "POST", "/api/v1/namespaces/default/events", body)  # connect first
            return await _cpu_per(n, lambda: _gather(one() for _ in range(n)))
        finally:
            await kube.close()


async def _gather(coroutines: Iterable[Awaitable[None]]) -> None:
    await asyncio.gather(*coroutines)


async def _webhook_us(n: int) -> float:
    # From the first answer to the last: the client's start (a process spawned) is not the server's cost.
    marks: list[float] = []

    async def answer(request: web.Request) -> web.Response:
        await request.read()
        response = web.Response(status=200, body=b"{}", content_type="application/json")
        marks.append(time.process_time())
        return response

    app = web.Application()
    app.router.add_post("/", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        client = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _POSTING_CLIENT, f"http://127.0.0.1:{port}/", str(n), str(IN_FLIGHT_API)
        )
        await client.wait()
        if len(marks) != n + 1:
            raise RuntimeError(f"the posting client made {len(marks)} requests of {n + 1}")
        return (marks[-1] - marks[0]) * 1e6 / max(n, 1)
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def _jetstream(directory: Path) -> AsyncIterator[Any]:
    server = await asyncio.to_thread(start_nats_server, directory)
    try:
        nc = await nats.connect(server.url)
        try:
            yield nc
        finally:
            await nc.close()
    finally:
        await asyncio.to_thread(server.stop)


async def _nats_costs(n: int, directory: Path) -> dict[str, float]:
    async with _jetstream(directory) as nc:
        js = nc.jetstream()
        await js.add_stream(name="FLOOR", subjects=["floor.>"])
        lease = await js.publish("floor.lease", b"term")
        fence = {
            "Nats-Expected-Last-Subject-Sequence": str(lease.seq),
            "Nats-Expected-Last-Subject-Sequence-Subject": "floor.lease",
        }
        record = b"x" * 400  # about a pod's record
        gate = asyncio.Semaphore(IN_FLIGHT_PUBLISH)

        async def put(subject: str, headers: dict[str, str] | None) -> None:
            async with gate:
                await js.publish(subject, record, headers=headers)

        costs = {
            "publish_fenced_us": await _cpu_per(
                n, lambda: _gather(put(f"floor.f.{i}", fence) for i in range(n))
            ),
            "publish_us": await _cpu_per(n, lambda: _gather(put(f"floor.p.{i}", None) for i in range(n))),
        }
        costs["receipt_fenced_us"] = await _receipt_us(js, "floor.f.>", n)
        costs["receipt_us"] = await _receipt_us(js, "floor.p.>", n)

        async def acks() -> None:
            for i in range(n):
                await nc.publish(f"floor.ack.{i % 16}", b"+ACK")
            await nc.flush()

        costs["ack_us"] = await _cpu_per(n, acks)
        return costs


async def _receipt_us(js: Any, subjects: str, n: int) -> float:
    """CPU per stored message on `subjects` read by an ordered consumer (what a KV watch is)."""
    done = asyncio.Event()
    seen = 0

    async def count(_msg: Any) -> None:
        nonlocal seen
        seen += 1
        if seen >= n:
            done.set()

    async def read() -> None:
        sub = await js.subscribe(subjects, cb=count, ordered_consumer=True)
        await done.wait()
        await sub.unsubscribe()

    return await _cpu_per(n, read)


async def measure(api_messages: int = 3000, nats_messages: int = 20000, repeats: int = 3) -> UnitCosts:
    """Each unit cost, measured on this machine `repeats` times, the least of them kept: a floor is what the
    library was seen to need, and this machine's noise (other processes, a shared host) only ever adds
    (about 15 s at the default sizes)."""
    seen: list[UnitCosts] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="kairos-floor-") as tmp:
            directory = Path(tmp)
            api = await _api_write_us(api_messages, directory)
            webhook = await _webhook_us(api_messages)
            rest = await _nats_costs(nats_messages, directory)
            watch = await _watch_event_us(api_messages)
        seen.append(UnitCosts(api_write_us=api, webhook_us=webhook, watch_event_us=watch, **rest))
    fields = UnitCosts.__struct_fields__
    return UnitCosts(**{name: min(getattr(u, name) for u in seen) for name in fields})


class _Record(msgspec.Struct, kw_only=True):
    """What the floor reads of a report's record (`tools.bench.report.Record`); the rest is left."""

    workload: str
    mode: str
    nodes: int
    calls: Calls | None = None
    replicas: dict[str, Annotated[int, msgspec.Meta(ge=0)]] | None = None
    cpu_ms_per_pod: dict[str, Annotated[float, msgspec.Meta(ge=0)]] | None = None


class _Report(msgspec.Struct, kw_only=True):
    records: list[_Record] = msgspec.field(default_factory=list)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure the unit costs, then print each bus record's floor of a report written by `kairos bench --json`."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.stderr.write("usage: python -m tools.bench.floor REPORT.json\n")
        return 2
    try:
        report = msgspec.json.decode(Path(args[0]).read_bytes(), type=_Report)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        sys.stderr.write(f"{args[0]}: not a report of kairos bench --json: {exc}\n")
        return 2
    records = [r for r in report.records if r.calls is not None]
    if not records:
        sys.stderr.write(f"{args[0]}: no bus record with calls counted (kairos bench --mode bus --json)\n")
        return 2
    units = event_loop.run(measure())
    for record in records:
        assert record.calls is not None
        replicas = record.replicas or dict.fromkeys(SERVICES, 1)
        floors = floor(record.calls, replicas, record.cpu_ms_per_pod or {}, units)
        sys.stdout.write(f"{record.workload} ({record.mode}, {record.nodes:,} nodes):\n")
        sys.stdout.write("\n".join(floor_table(floors, units)) + "\n\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
