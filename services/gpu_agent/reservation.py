"""The reservation container: holds one shared GPU on its node and says which device it holds.

For a fractional pod (``gpu-fraction``, ``gpu-memory``), the binder holds a whole device for the pods that
share it by creating a reservation pod in namespace ``kai-resource-reservation``
(`shared.kube.gpu_sharing.reservation_pod`: placed with ``spec.nodeName``, requesting ``nvidia.com/gpu: 1``,
its own name and namespace in ``POD_NAME`` and ``POD_NAMESPACE``). This program is that pod's container,
run as ``python -m services.gpu_agent.reservation`` (or the console script ``kairos-reservation``); nothing
else starts it.

Which device the node gave the pod is known only on the node: the device plugin picks it, and the
container runtime shows the container that device and no other. So the container asks NVML which devices
it sees (`gpu_sharing.visible_device_uuids`), expects exactly one, and writes its UUID into its own pod's
annotation ``run.ai/reserve_for_gpu_index`` (`gpu_sharing.reserved_device_patch`, a merge patch through the
pod's service account, or KUBECONFIG outside a cluster; temporary API errors are retried with backoff).
The binder reads the annotation back and gives the sharers that device. Then the program only waits: the
running container is what keeps the device allocated to this pod, so it runs until SIGTERM or SIGINT
(exit 0; the binder deletes the pod when no sharer is left).

Exit 1, with one line on stderr, when NVML cannot be used, when NVML shows no device or several, or when
the pod cannot be annotated (the kubelet restarts the container); exit 2 when ``POD_NAME`` or
``POD_NAMESPACE`` is missing. NVML is initialised and its errors translated by `services.gpu_agent.nvml`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import random
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pynvml

from services.gpu_agent.nvml import NvmlError, NvmlModule, NvmlReader
from shared.backoff import Backoff
from shared.errors import ConfigError, InvalidObject, KairosError
from shared.kube import gpu_sharing
from shared.kubeapi.client import connect

__all__ = [
    "PATCH_BACKOFF",
    "ReservationSettings",
    "annotate",
    "held_device",
    "reserve",
    "run",
]

PROGRAM = "kairos reservation"
PATCH_BACKOFF = Backoff(attempts=10, base=0.5, cap=8.0)
"""Retries of the self-annotation on temporary API errors (no answer, 429, 5xx): about 40 s in all, enough
for an API server restart; after that the container exits 1 and the kubelet's restart backoff takes over."""
MERGE_PATCH = "application/merge-patch+json"

log = logging.getLogger("kairos.reservation")


@dataclass(frozen=True)
class ReservationSettings:
    """Who the container is, from its environment (the reservation pod sets both by the downward API)."""

    pod_name: str
    namespace: str
    kubeconfig: str | None = None
    """A kubeconfig file (env KUBECONFIG; tests and runs outside a cluster); None: the in-cluster account."""

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.pod_name}"

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ReservationSettings:
        missing = [name for name in ("POD_NAME", "POD_NAMESPACE") if not environ.get(name)]
        if missing:
            raise ConfigError(
                f"environment: {' and '.join(missing)} not set (the reservation pod sets them from "
                "metadata.name and metadata.namespace through the downward API)"
            )
        return cls(environ["POD_NAME"], environ["POD_NAMESPACE"], environ.get("KUBECONFIG") or None)


def held_device(pod: str, nvml: NvmlModule | None = None) -> str:
    """The UUID of the one device NVML shows this container. `NvmlUnavailable` without a usable driver,
    `NvmlError` when NVML fails while listing, `InvalidObject` naming `pod` when it shows none or several."""
    module: Any = pynvml if nvml is None else nvml
    reader = NvmlReader(module)
    reader.open()
    try:
        uuids = gpu_sharing.visible_device_uuids(module)
    except Exception as exc:
        # The same translation as the agent's: whatever the C binding raises becomes one named error.
        raise NvmlError("listing the visible devices", f"{type(exc).__name__} ({exc})") from exc
    finally:
        reader.close()
    try:
        gpu_sharing.reserved_device_patch(uuids)
    except InvalidObject as exc:
        seen = f" ({', '.join(uuids)})" if uuids else ""
        raise InvalidObject(
            "Pod",
            pod,
            exc.field,
            f"NVML shows this container {len(uuids)} devices{seen}; a reservation holds exactly one "
            "(nvidia.com/gpu: 1): is the NVIDIA container runtime this pod's runtime class?",
        ) from exc
    return uuids[0]


async def annotate(
    settings: ReservationSettings,
    uuid: str,
    *,
    backoff: Backoff = PATCH_BACKOFF,
    rng: random.Random | None = None,
) -> None:
    """Merge-patch the device into the pod's own annotation, retrying temporary API errors.

    `ApiError` for a refusal (403, 404), `TemporaryError` when the retries run out, `ConfigError` for an
    unusable kubeconfig or in-cluster configuration."""
    kube = await connect(settings.kubeconfig)
    try:
        await kube.call_with_retries(
            f"pods {settings.pod}",
            kube.core.patch_namespaced_pod,
            settings.pod_name,
            settings.namespace,
            gpu_sharing.reserved_device_patch([uuid]),
            backoff=backoff,
            rng=rng,
            _content_type=MERGE_PATCH,
        )
    finally:
        await kube.close()


async def reserve(
    settings: ReservationSettings,
    uuid: str,
    stopping: asyncio.Event,
    *,
    backoff: Backoff = PATCH_BACKOFF,
) -> None:
    """Annotate the pod with `uuid`, then hold the device until `stopping` is set (also while annotating:
    a pod deleted early stops at once). Errors as `annotate`'s."""
    patching = asyncio.ensure_future(annotate(settings, uuid, backoff=backoff))
    stop = asyncio.ensure_future(stopping.wait())
    try:
        await asyncio.wait({patching, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (patching, stop):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
    if patching.cancelled():
        log.info("stopped before pod %s was annotated", settings.pod)
        return
    patching.result()
    log.info(
        "holding GPU %s for the pods sharing it (pod %s, annotation %s)",
        uuid,
        settings.pod,
        gpu_sharing.RESERVED_DEVICE_ANNOTATION,
    )
    await stopping.wait()
    log.info("stopping: GPU %s is released with pod %s", uuid, settings.pod)


async def _main(settings: ReservationSettings, uuid: str) -> None:
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await reserve(settings, uuid, stopping)


def _parser() -> argparse.ArgumentParser:
    return argparse.ArgumentParser(
        prog="kairos-reservation",
        description=(
            "The container of a GPU reservation pod (created by Kairos's binder): writes the UUID of the one "
            f"GPU it sees into its pod's annotation {gpu_sharing.RESERVED_DEVICE_ANNOTATION}, then holds it "
            "until SIGTERM. Reads POD_NAME and POD_NAMESPACE, and KUBECONFIG outside a cluster."
        ),
    )


def run(
    argv: Sequence[str] | None = None,
    *,
    nvml: NvmlModule | None = None,
    environ: Mapping[str, str] | None = None,
) -> int:
    """`python -m services.gpu_agent.reservation`: 0 after SIGTERM/SIGINT, 1 without NVML, without exactly
    one device or when the pod cannot be annotated, 2 on a missing setting."""
    _parser().parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("KAIROS_LOG_LEVEL", "INFO").upper(),
        format="%(asctime)s reservation %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = ReservationSettings.from_environ(os.environ if environ is None else environ)
    except ConfigError as exc:
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 2
    try:
        uuid = held_device(settings.pod, nvml)
        asyncio.run(_main(settings, uuid))
    except KeyboardInterrupt:
        return 0  # Ctrl-C before the loop took SIGINT over: a stop like any other
    except KairosError as exc:
        # NvmlUnavailable says "no usable NVIDIA driver/NVML on this machine: nvmlInit failed with ...".
        print(f"{PROGRAM}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(run())
