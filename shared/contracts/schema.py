"""Generate docs/events.md and the JSON Schema of the public events from the structs in `events.py`.

`python -m shared.contracts.schema` rewrites docs/events.md; a test fails when the committed file differs
from what the structs generate, so the documentation cannot drift from the contract.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import msgspec

from shared.contracts import events
from shared.contracts import subjects as s

DOC = Path(__file__).resolve().parents[2] / "docs" / "events.md"

EXAMPLES: dict[str, events.Event] = {
    "pod-bound": events.PodBound(
        time=1764000000.0,
        namespace="team-a",
        pod="train-0",
        podgroup="train",
        queue="research",
        node="gpu-7",
        gpu_groups=[],
    ),
    "pod-evicted": events.PodEvicted(
        time=1764000000.0,
        namespace="team-a",
        pod="train-3",
        podgroup="train",
        node="gpu-2",
        reason="Pod team-a/train-3 was reclaimed by podgroup team-b/infer of queue product",
    ),
    "pod-unschedulable": events.PodUnschedulable(
        time=1764000000.0,
        namespace="team-a",
        podgroup="big",
        queue="research",
        message="Resources were found for 3 pods while 4 are required for gang scheduling. ...",
        reasons=["PodSchedulingErrors"],
    ),
    "podgroup-state": events.PodGroupState(
        time=1764000000.0, namespace="team-a", podgroup="train", queue="research", phase="Running", running=8
    ),
    "queue-fair-share": events.QueueFairShare(
        time=1764000000.0,
        queue="research",
        parent="org",
        fair_share={"gpu": 16.0, "cpu": 64000.0, "memory": 5.1e11},
        allocated={"gpu": 8.0, "cpu": 8000.0, "memory": 3.2e10},
        requested={"gpu": 24.0, "cpu": 24000.0, "memory": 9.6e10},
        deserved={"gpu": 16.0, "cpu": -1.0, "memory": -1.0},
        usage={"gpu": 0.25, "cpu": 0.125, "memory": 0.0625},
    ),
    "podgroup-admission": events.PodGroupAdmission(
        time=1764000000.0,
        namespace="team-a",
        podgroup="train",
        queue="team-a",
        admitted=True,
        pods=["train-0", "train-1"],
        reason="OverLimit",
        message=(
            "queue team-a: GPU quota has reached the allowable limit of 8 GPUs. Limit is 8 GPUs, currently "
            "8 GPUs allocated and workload requested 4 GPUs"
        ),
        limited_by="team-a",
    ),
}


def render() -> str:
    _, components = msgspec.json.schema_components([events.Event], ref_template="#/$defs/{name}")
    lines = [
        "# Kairos events (version 1)",
        "",
        "Kairos publishes what it decides on NATS, as JSON, so any NATS client can follow the scheduler:",
        "",
        "```sh",
        "nats sub 'kairos.events.>'",
        "```",
        "",
        (
            f"Subjects are `kairos.events.<type>.<name>`; types: {', '.join(f'`{k}`' for k in s.EVENT_KINDS)}. "
            f"Events are also kept for a day in the JetStream stream `{s.EVENTS_STREAM}`, so a consumer can "
            "replay them. Every event has `type`, `v` (the contract version, 1) and `time` (seconds since the "
            "epoch). Compatibility: new fields only ever get defaults and no field changes meaning, so ignore "
            "fields you do not know."
        ),
        "",
        "This page is generated from `shared/contracts/events.py` by `python -m shared.contracts.schema`.",
        "",
    ]
    for kind, example in EXAMPLES.items():
        cls = type(example)
        doc = (cls.__doc__ or "").strip()
        lines += [f"## `{kind}`", "", doc, "", "Example:", "", "```json"]
        lines.append(json.dumps(json.loads(events.EVENT_ENCODER.encode(example)), indent=2))
        lines += ["```", ""]
    lines += [
        "## JSON Schema",
        "",
        "```json",
        json.dumps({"$defs": components}, indent=2, sort_keys=True),
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    DOC.write_text(render())
    sys.stdout.write(f"wrote {DOC}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
