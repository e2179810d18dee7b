"""`kairos explain POD|PODGROUP`: why it is pending, where it runs, or why it was evicted, in plain words.

Registered by `tools.cli.main`. Gathers, from the running stack (found as `kairos status` finds it):
the cluster as the state service holds it (a snapshot), the newest public events about the pod and its
podgroup (pod-unschedulable, pod-evicted, pod-bound, podgroup-state, and the quota gate's
podgroup-admission, kept in the `KAIROS_EVENTS` stream), the state service's reason for holding the
object back when it does, and, for a pending podgroup, the podgroups of its queue ahead of it (the core's
queue plan run on the snapshot); then `shared.explain.explain` words the answer. The same words reach kubectl through the write-back's Events
and PodGroup status.

    kairos explain too-big                 a pod (or, failing that, a podgroup) in namespace default
    kairos explain pod/train-0 -n team     kubectl-style kind prefixes: pod/, podgroup/ (or pg/)
    kairos explain podgroup/train --json   the same answer as JSON
    kairos explain train -v                also list the podgroups ahead of it in its queue

Exit codes: 0 answered; 1 the stack did not answer; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from shared.errors import ConfigError, TemporaryError
from shared.model.status import DEFAULT_STUCK_IN_RELEASING_THRESHOLD
from tools.cli.cluster_cmds import _connect, _no_answer, _run, _stack_arguments, cluster_of, nats_url

if TYPE_CHECKING:
    from collections.abc import Sequence

    from shared.bus.client import BusClient
    from shared.contracts.messages import ShardRecord
    from shared.explain import Explanation, Facts
    from shared.model import Pod, Snapshot

KINDS = {
    "pod": "pod",
    "pods": "pod",
    "po": "pod",
    "podgroup": "podgroup",
    "podgroups": "podgroup",
    "pg": "podgroup",
}


def add_commands(commands: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    explain = commands.add_parser("explain", help="why a pod or podgroup is pending, running or evicted")
    explain.add_argument("target", metavar="POD|PODGROUP", help="name, or pod/NAME, podgroup/NAME")
    explain.add_argument("-n", "--namespace", default="default")
    explain.add_argument("--json", action="store_true", help="print the answer as JSON")
    explain.add_argument(
        "-v", "--verbose", action="store_true", help="also list the podgroups ahead of it in its queue"
    )
    _stack_arguments(explain)
    explain.set_defaults(handler=cmd_explain)


def parse_target(text: str) -> tuple[str | None, str]:
    """("pod" | "podgroup" | None, name) from `pod/NAME`, `podgroup/NAME` or a bare NAME."""
    kind, sep, name = text.partition("/")
    if not sep:
        return None, text
    if kind.lower() not in KINDS or not name:
        raise ConfigError(f"explain: {text!r}: expected NAME, pod/NAME or podgroup/NAME")
    return KINDS[kind.lower()], name


def cmd_explain(args: argparse.Namespace) -> int:
    kind, name = parse_target(args.target)
    url = nats_url(args)
    try:
        answer = _run(_explain(url, kind, args.namespace, name))
    except TemporaryError as exc:
        return _no_answer(str(exc))
    if args.json:
        print(
            json.dumps(
                {
                    "subject": answer.subject,
                    "status": answer.status,
                    "reasons": answer.reasons,
                    "ahead": answer.ahead,
                }
            )
        )
    else:
        print("\n".join(answer.lines(verbose=args.verbose)))
    return 0


async def _explain(url: str, kind: str | None, namespace: str, name: str) -> Explanation:
    from shared.explain import explain

    client = await _connect(url)
    try:
        return explain(await gather(client, kind, namespace, name))
    finally:
        await client.close()


async def gather(client: BusClient, kind: str | None, namespace: str, name: str) -> Facts:
    """Everything the stack knows about the pod or podgroup `namespace/name`."""
    from shared.contracts import subjects as s
    from shared.contracts.events import (
        PodBound,
        PodEvicted,
        PodGroupAdmission,
        PodGroupState,
        PodUnschedulable,
    )
    from shared.explain import Facts
    from shared.model import PodStatus

    snapshot = await client.snapshot()
    pod = next((p for p in snapshot.pods if p.namespace == namespace and p.name == name), None)
    if kind == "podgroup":
        pod = None
    groups = {g.key: g for g in snapshot.podgroups}
    group = groups.get(pod.podgroup) if pod is not None else None
    if pod is None and kind != "pod":
        group = next((g for g in snapshot.podgroups if g.namespace == namespace and g.name == name), None)
    queues = {q.name: q for q in snapshot.queues}
    members = [p for p in snapshot.pods if group is not None and p.podgroup == group.key]

    unschedulable = state = bound = evicted = admission = None
    if group is not None:
        event = await client.last_event(s.event("podgroup-admission", group.key))
        admission = event if isinstance(event, PodGroupAdmission) else None
        event = await client.last_event(s.event("pod-unschedulable", group.key))
        unschedulable = event if isinstance(event, PodUnschedulable) else None
        event = await client.last_event(s.event("podgroup-state", group.key))
        state = event if isinstance(event, PodGroupState) else None
    if pod is not None:
        event = await client.last_event(s.event("pod-bound", pod.key))
        bound = event if isinstance(event, PodBound) else None
        event = await client.last_event(s.event("pod-evicted", pod.key))
        evicted = event if isinstance(event, PodEvicted) else None
    elif group is None and kind != "podgroup":
        # A deleted pod (an evicted Job pod is replaced by a new one): find its eviction by name.
        for event in reversed(await client.last_events("pod-evicted")):
            if isinstance(event, PodEvicted) and event.namespace == namespace and event.pod == name:
                evicted = event
                break
    ahead: tuple[str, ...] = ()
    if group is not None and (pod is None or pod.status == PodStatus.PENDING):
        ahead = queue_ahead(cluster_of(snapshot), group.key, time.time())
    held = ""
    if pod is None and group is None:
        held = await client.why(kind or "pod", f"{namespace}/{name}")
        if not held and kind is None:
            held = await client.why("podgroup", f"{namespace}/{name}")
    elif pod is not None and group is not None and group.queue not in queues:
        held = await client.why("podgroup", f"{group.namespace}/{group.name}")
    return Facts(
        now=time.time(),
        stuck_after=stuck_after(snapshot.shards, pod),
        namespace=namespace,
        name=name,
        pod=pod,
        podgroup=group,
        members=members,
        queue=queues.get(group.queue) if group is not None else None,
        nodes=len(snapshot.nodes),
        unschedulable=unschedulable,
        evicted=evicted,
        bound=bound,
        state=state,
        held=held,
        admission=admission,
        ahead=ahead,
    )


def stuck_after(shards: Sequence[ShardRecord], pod: Pod | None) -> float:
    """How long the pod's shard lets a Running pod delete before it is stuck in releasing: the shard whose
    node pool the pod's label names, else the default shard (its SchedulingShard's
    ``args.stuck-in-releasing-threshold``), else KAI's 2 minutes."""
    from shared.contracts import subjects as s
    from shared.kube.scheduling_shard import policy_of

    def of(record: ShardRecord) -> float:
        return policy_of(record.config).stuck_in_releasing_threshold

    for record in shards:
        pool = record.pool
        if pod is not None and pool.value and pod.labels.get(pool.label_key) == pool.value:
            return of(record)
    default = next((r for r in shards if r.shard == s.DEFAULT_SHARD), None)
    return of(default) if default is not None else DEFAULT_STUCK_IN_RELEASING_THRESHOLD


def queue_ahead(snapshot: Snapshot, podgroup: str, now: float) -> tuple[str, ...]:
    """The pending podgroups of `podgroup`'s queue that the core's allocate takes before it (its queue
    plan, `shared.core.queue_plan`: within a queue the order is the job order, priority first, which the
    shard's fair-share settings do not change); empty when it is not pending."""
    from shared.core.policy import Policy
    from shared.core.queue_plan import plan_queues

    pending = plan_queues(snapshot, now, Policy()).pending
    if podgroup not in pending:
        return ()
    queue_of = {g.key: g.queue for g in snapshot.podgroups}
    mine = queue_of[podgroup]
    before = pending[: pending.index(podgroup)]
    return tuple(key for key in before if queue_of.get(key) == mine)
