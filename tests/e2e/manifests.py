"""The Kubernetes manifests the end-to-end tests apply with kubectl, built once, as KAI's users write them.

`pod(name, ...)`: a pod for KAI's scheduler in `default-queue`, one container `main` (GPUs as a limit, CPU
as a request, annotations, environment); `job(name, ...)`: a batch/v1 Job of one such container;
`queue(name, ...)`: a KAI Queue with a GPU quota. `documents(*objects)` is the multi-document YAML that
`kubectl apply -f -` reads. Used by the GPU-sharing, pipeline, bad-input, interop and restart tests.
"""

from __future__ import annotations

from typing import Any

import yaml

from tests.builders import queue_manifest

Manifest = dict[str, Any]

DEFAULT_QUEUE = "default-queue"
QUEUE_LABEL = "kai.scheduler/queue"
SCHEDULER = "kai-scheduler"


def container(
    *,
    image: str = "ubuntu",
    gpus: str | None = None,
    cpu: str | None = None,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
) -> Manifest:
    """The container `main`: `gpus` as an nvidia.com/gpu limit, `cpu` as a request."""
    out: Manifest = {"name": "main", "image": image}
    if command is not None:
        out["command"] = command
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in env.items()]
    resources: Manifest = {}
    if gpus is not None:
        resources["limits"] = {"nvidia.com/gpu": gpus}
    if cpu is not None:
        resources["requests"] = {"cpu": cpu}
    if resources:
        out["resources"] = resources
    return out


def _metadata(name: str, annotations: dict[str, str] | None) -> Manifest:
    meta: Manifest = {"name": name, "labels": {QUEUE_LABEL: DEFAULT_QUEUE}}
    if annotations:
        meta["annotations"] = dict(annotations)
    return meta


def pod(
    name: str,
    *,
    annotations: dict[str, str] | None = None,
    image: str = "ubuntu",
    gpus: str | None = None,
    cpu: str | None = None,
    env: dict[str, str] | None = None,
) -> Manifest:
    """A pod of one container for KAI's scheduler, in `default-queue`."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _metadata(name, annotations),
        "spec": {
            "schedulerName": SCHEDULER,
            "containers": [container(image=image, gpus=gpus, cpu=cpu, env=env)],
        },
    }


def job(
    name: str,
    *,
    annotations: dict[str, str] | None = None,
    command: list[str] | None = None,
    cpu: str = "1",
    backoff_limit: int | None = None,
) -> Manifest:
    """A Job of one busybox container for KAI's scheduler, in `default-queue`, never restarted."""
    spec: Manifest = {}
    if backoff_limit is not None:
        spec["backoffLimit"] = backoff_limit
    spec["template"] = {
        "spec": {
            "schedulerName": SCHEDULER,
            "restartPolicy": "Never",
            "containers": [container(image="busybox", cpu=cpu, command=command)],
        }
    }
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": _metadata(name, annotations), "spec": spec}


def queue(name: str, *, gpu_quota: int, parent: str = "default-parent-queue") -> Manifest:
    """A KAI Queue under `parent` deserving `gpu_quota` GPUs, without a limit."""
    return queue_manifest(name, parent, gpu_quota=gpu_quota, weight=1)


def documents(*objects: Manifest) -> str:
    """One YAML stream of `objects`, for `kubectl apply -f -`."""
    return yaml.safe_dump_all(objects, sort_keys=False)
