"""Tracing overhead (`make bench-tracing`): scheduling throughput over the bus with tracing off and on, and
the cost per message and per podgroup of the tracing code itself.

- `bus`: the whole stack as processes (nats-server, state with the in-memory cluster, queue, placement,
  binder, `kairos up --memory`'s shape), `--pods` one-pod podgroups submitted at once onto `--nodes` 8-GPU
  nodes, timed from the submission until every pod is Running. Tracing on is `always_on`, exported to a
  local OTLP/HTTP endpoint that answers 200 and discards; off is no OTEL_* variable (the no-op tracer).
  Runs alternate off/on `--rounds` times; the best of each is kept (the machine is shared).
- `message`: the bus middleware handling one work item with one podgroup's context in its headers.
- `podgroup`: the spans one podgroup costs on its way: state.observe, queue.order, placement.place (with
  its share of placement.session), binder.commit and one binder.bind, built and exported (batch processor,
  discarding exporter).

Prints one line per figure and the on/off throughput ratio; `--json FILE` writes them too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from nats.aio.msg import Msg
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from shared.bus.client import BusClient
from shared.bus.connection import connect
from shared.bus.middleware import Counters, handle
from shared.bus.replica import StateReplica
from shared.bus.trace_context import carried, carried_by, headers_for
from shared.contracts import subjects as s
from shared.contracts.events import QueueFairShare
from shared.contracts.messages import (
    WORK,
    ApplyRequest,
    Binding,
    Outcome,
    PodRecord,
    Proposal,
    WorkItem,
    encode,
)
from shared.model import PodStatus, Queue, QueueResource, Snapshot
from shared.model.builders import gang, gpu_nodes
from shared.telemetry import spans, tracing
from shared.telemetry.attempts import AttemptTracker
from tools.stack.supervisor import start_stack

UNBOUNDED = QueueResource(quota=-1, over_quota_weight=1, limit=-1)


# --- over the bus -----------------------------------------------------------------------------------------------
@contextmanager
def discarding_collector() -> Iterator[str]:
    """An OTLP/HTTP endpoint that reads each export and answers 200 (the cost stays in the services)."""

    class Discard(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Discard)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


async def _submit_and_wait(url: str, nodes: int, pods: int, timeout: float) -> float:
    client = await BusClient.connect(url)
    bus = await connect(url, "bench-tracing")
    replica = StateReplica(bus)
    await replica.start()
    try:
        queues = (
            Queue(name="org", gpu=UNBOUNDED, cpu=UNBOUNDED, memory=UNBOUNDED),
            *(
                Queue(name=f"team-{i}", parent="org", creation_index=i, gpu=QueueResource(quota=nodes * 2))
                for i in range(4)
            ),
        )
        reply = await client.apply(ApplyRequest(nodes=tuple(gpu_nodes(nodes)), queues=queues))
        assert reply.ok, reply.error
        groups, all_pods = [], []
        for j in range(pods):
            group, members = gang(f"job-{j:05d}", f"team-{j % 4}", 1, 1.0, created=float(j))
            groups.append(group)
            all_pods.extend(members)
        start = time.perf_counter()
        for first in range(0, pods, 250):
            reply = await client.apply(
                ApplyRequest(
                    podgroups=tuple(groups[first : first + 250]), pods=tuple(all_pods[first : first + 250])
                )
            )
            assert reply.ok, reply.error
        deadline = start + timeout
        while True:
            # The replica, not a snapshot request: a large cluster's snapshot exceeds NATS's max payload.
            running = sum(
                1
                for r in replica.records.values()
                if isinstance(r, PodRecord) and r.pod.status == PodStatus.RUNNING
            )
            if running >= pods:
                return time.perf_counter() - start
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{running}/{pods} pods running after {timeout:.0f} s")
            await asyncio.sleep(0.05)
    finally:
        await replica.stop()
        await bus.close()
        await client.close()


def bus_run(nodes: int, pods: int, env: dict[str, str], timeout: float, batch: str = "all") -> float:
    with tempfile.TemporaryDirectory(prefix="kairos-bench-") as state:
        options = {"state": {"source": "sim"}, "queue": {"batch": batch}}
        stack = start_stack(Path(state), options=options, env=env)
        try:
            return asyncio.run(_submit_and_wait(stack.url, nodes, pods, timeout))
        finally:
            stack.stop()


def bench_bus(nodes: int, pods: int, rounds: int, timeout: float, batch: str = "all") -> dict[str, Any]:
    off: list[float] = []
    on: list[float] = []
    with discarding_collector() as url:
        traced = {"OTEL_EXPORTER_OTLP_ENDPOINT": url, "OTEL_TRACES_SAMPLER": "always_on"}
        for _ in range(rounds):
            off.append(bus_run(nodes, pods, {}, timeout, batch))
            on.append(bus_run(nodes, pods, traced, timeout, batch))
    return {
        "batch": batch,
        "nodes": nodes,
        "pods": pods,
        "rounds": rounds,
        "off_pods_per_s": pods / min(off),
        "on_pods_per_s": pods / min(on),
        "off_seconds_median": statistics.median(off),
        "on_seconds_median": statistics.median(on),
        "on_off_ratio": min(off) / min(on),
    }


# --- in process ----------------------------------------------------------------------------------------------
class Discarding(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:  # noqa: ARG002 -- discarded
        return SpanExportResult.SUCCESS


@contextmanager
def traced_process() -> Iterator[None]:
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discarding()))
    with tracing.use(provider):
        yield
    provider.shutdown()


def _per_call_us(call: Callable[[], Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def bench_message(n: int = 20_000) -> dict[str, float]:
    """The middleware on one work item: without headers and tracing off, then with one podgroup's context."""
    item = WorkItem(id="w", shard="default", term=1, leader="q", now=0.0, state_revision=1, podgroups=("a",))
    data = encode(item)
    counters = Counters()

    async def handler(_item: WorkItem, _msg: Msg) -> None:
        carried().parent_of("a")

    async def loop(headers: dict[str, str] | None) -> float:
        msg = Msg(_client=None, subject=s.work("default"), data=data, headers=headers)  # type: ignore[arg-type]
        start = time.perf_counter()
        for _ in range(n):
            await handle(msg, WORK, handler, counters, jetstream=False)
        return (time.perf_counter() - start) / n * 1e6

    off = asyncio.run(loop(None))
    with traced_process():
        span = tracing.tracer().start_span("queue.order")
        span.end()
        on = asyncio.run(loop(headers_for({"a": span.get_span_context()})))
    return {"messages": n, "off_us": off, "on_us": on, "added_us": on - off}


def bench_podgroup(n: int = 2_000) -> dict[str, float]:
    """Every span one podgroup costs from observed to bound, per podgroup, in batches of 100 podgroups."""
    with traced_process():
        elapsed = asyncio.run(_podgroups(n))
    return {"podgroups": n, "us_per_podgroup": elapsed / n * 1e6}


async def _podgroups(n: int) -> float:
    groups = [gang(f"job-{j:05d}", "team", 1)[0] for j in range(n)]
    share = QueueFairShare(
        time=0.0,
        queue="team",
        parent=None,
        fair_share={"gpu": 8.0},
        allocated={"gpu": 4.0},
        requested={"gpu": 16.0},
        deserved={"gpu": 8.0},
    )
    cluster = spans.TracedCluster(_Accepting())
    item = WorkItem(id="w", shard="default", term=1, leader="q", now=0.0, state_revision=1)
    start = time.perf_counter()
    for first in range(0, n, 100):
        batch = groups[first : first + 100]
        tracker = AttemptTracker("sim")
        tracker.observe([(s.podgroup_key("", g.name), g) for g in batch])
        pods = [gang(g.name, "team", 1)[1][0] for g in batch]
        tracker.observe([(s.pod_key("", p.name), p) for p in pods])
        records = {s.podgroup_key("", g.name): tracker.record(g) for g in batch}
        keys = [g.key for g in batch]
        cycle = spans.OrderTracer().cycle(keys, Snapshot(podgroups=tuple(batch)), [share], records, 0)
        assert cycle is not None
        received = carried_by(cycle.order(item, keys))
        details = {
            key: spans.PlaceDetail({spans.PODGROUP: key, spans.RESULT: "bound"}, "bound") for key in keys
        }
        binds = tuple(
            Binding(pod=p.key, namespace="", name=p.name, podgroup=p.podgroup, node="node-0") for p in pods
        )
        proposal = Proposal(
            id="p", work="w", shard="default", term=1, leader="q", state_revision=1, binds=binds
        )
        placed = carried_by(spans.placement_spans(item, proposal, details, received, 0, 1))
        with spans.CommitTrace(proposal, placed, lambda _key: None) as commit:
            for binding in binds:
                await cluster.bind(binding)
            commit.finish(Outcome(proposal="p", work="w", shard="default", status="committed"))
    return time.perf_counter() - start


class _Accepting:
    """A cluster that accepts every call at once: only the tracing around the call is measured."""

    async def bind(self, _binding: Binding) -> None:
        return None

    async def evict(self, _eviction: Any) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", type=Path, help="also write the results as JSON")
    parser.add_argument("--nodes", type=int, default=250)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--batch",
        default="all",
        help="the queue's batch: all (whole cycles; default) or N podgroups per item",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--skip-bus", action="store_true", help="only the in-process figures")
    args = parser.parse_args(argv)
    # Stopped from outside (timeout, kill): unwind, so the stack's processes are stopped too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results: dict[str, dict[str, Any]] = {
        "message": bench_message(),
        "podgroup": bench_podgroup(),
    }
    print(
        f"middleware per message: {results['message']['off_us']:.1f} us untraced, "
        f"{results['message']['on_us']:.1f} us with a context (+{results['message']['added_us']:.1f} us)"
    )
    print(f"spans per podgroup, observed to bound: {results['podgroup']['us_per_podgroup']:.0f} us")
    if not args.skip_bus:
        bus = results["bus"] = bench_bus(args.nodes, args.pods, args.rounds, args.timeout, args.batch)
        print(
            f"over the bus, {args.pods} pods on {args.nodes} nodes, batch={args.batch}: "
            f"{bus['off_pods_per_s']:.0f} pods/s "
            f"tracing off, {bus['on_pods_per_s']:.0f} pods/s on (always_on): ratio {bus['on_off_ratio']:.2f}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
