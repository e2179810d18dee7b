"""Image pulls as the simulated kubelet reports them: every image can be pulled, except one from a registry
that cannot exist.

An image whose registry host ends in ``.invalid`` (RFC 2606 reserves the name: it never resolves, so a test
names an image that can never be pulled without configuring anything) fails to pull as containerd fails a
host it cannot resolve. The kubelet then reports the container waiting, first ``ErrImagePull`` with the
runtime's message, then ``ImagePullBackOff`` (``Back-off pulling image "..."``) while it backs off, with
the kubelet's Events ``Failed`` (``Failed to pull image "...": ...``) and ``BackOff`` (kubesim keeps one
Event per reason, so the kubelet's ``Error: ErrImagePull`` that follows each is left out). The pod stays
Pending and keeps the devices it was admitted with.

Used by `tools.kubesim.kubelet`. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = [
    "ERR_IMAGE_PULL",
    "IMAGE_PULL_BACKOFF",
    "UNRESOLVABLE_SUFFIX",
    "backoff_message",
    "pull_failure",
    "pulls_failing",
]

Obj = dict[str, Any]

ERR_IMAGE_PULL = "ErrImagePull"
"""The container's waiting reason right after a pull failed."""
IMAGE_PULL_BACKOFF = "ImagePullBackOff"
"""The container's waiting reason while the kubelet backs off before pulling again."""
UNRESOLVABLE_SUFFIX = ".invalid"
"""A registry host ending so never resolves (RFC 2606)."""


def _registry(image: str) -> str:
    """The registry (host, and port when given) of an image reference as containerd reads it ("" for
    Docker Hub's short names)."""
    first, slash, _ = image.partition("/")
    if slash and ("." in first or ":" in first or first == "localhost"):
        return first
    return ""


def pull_failure(image: str) -> str | None:
    """Why `image` cannot be pulled, in the runtime's words (the container's ``ErrImagePull`` message);
    None when it can."""
    registry = _registry(image)
    host = registry.split(":", 1)[0]
    if not host.endswith(UNRESOLVABLE_SUFFIX):
        return None
    path = image.partition("/")[2]
    repository, at, digest = path.partition("@")
    if not at:
        name, colon, tag = repository.rpartition(":")
        repository, digest = (name, tag) if colon and "/" not in tag else (repository, "latest")
    reference = image if at or repository != path else f"{image}:latest"
    return (
        f'failed to pull and unpack image "{reference}": failed to resolve reference "{reference}": '
        f'failed to do request: Head "https://{registry}/v2/{repository}/manifests/{digest}": '
        f"dial tcp: lookup {host}: no such host"
    )


def backoff_message(image: str) -> str:
    """The container's ``ImagePullBackOff`` message."""
    return f'Back-off pulling image "{image}"'


def pulls_failing(containers: Iterable[Obj]) -> bool:
    """Whether any of `containers` names an image that cannot be pulled."""
    return any(pull_failure(str(c.get("image", ""))) is not None for c in containers)
