"""Create the objects a fresh cluster needs before Kairos schedules on it (KAI's default queues and shard).

Called by `kairos up` (`tools.stack.supervisor`) once the cluster's API answers, as KAI's installer does on a
real cluster. Objects that already exist are left as they are: a user's edits to the default queues and shard
survive a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from shared.backoff import Backoff
from shared.errors import ConfigError
from shared.kubeapi.client import ApiError, connect
from shared.kubeapi.paths import collection_path, raw_call

ALREADY_EXISTS = 409
NOT_FOUND = 404
RETRIES = Backoff(attempts=20, base=0.05, cap=1.0)
"""How each call is retried while the freshly started API server settles."""


def load_manifests(path: Path) -> list[dict[str, Any]]:
    """The objects of a multi-document YAML file; a document that is not an object names the file."""
    try:
        docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"{path}: {exc}") from exc
    for index, doc in enumerate(docs):
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise ConfigError(f"{path}: document {index + 1} is not a Kubernetes object")
    return docs


async def ensure_objects(kubeconfig: str, *paths: Path) -> list[str]:
    """Create each object of the files, in order, unless it exists; returns the names of those created."""
    manifests = [(path, manifest) for path in paths for manifest in load_manifests(path)]
    kube = await connect(kubeconfig)
    created: list[str] = []
    try:
        for path, manifest in manifests:
            where, collection = _placed(manifest)
            try:
                await kube.call_with_retries(
                    f"create {where}", raw_call, kube, "POST", collection, manifest, backoff=RETRIES
                )
            except ApiError as exc:
                if exc.status != ALREADY_EXISTS:
                    raise ConfigError(f"{path}: {exc}") from exc
            else:
                created.append(where)
    finally:
        await kube.close()
    return created


async def replace_object(kubeconfig: str, manifest: dict[str, Any]) -> None:
    """Create the object, replacing one of the same name (`kairos up` registers its webhook afresh: the
    replicas' ports change from one start to the next)."""
    await replace_objects(kubeconfig, [manifest])


async def replace_objects(kubeconfig: str, manifests: list[dict[str, Any]]) -> None:
    """`replace_object` for each of `manifests` in order (cluster-scoped or in their
    `metadata.namespace`), over one connection."""
    kube = await connect(kubeconfig)
    try:
        for manifest in manifests:
            where, collection = _placed(manifest)
            try:
                await kube.call_with_retries(
                    f"delete {where}",
                    raw_call,
                    kube,
                    "DELETE",
                    f"{collection}/{manifest['metadata']['name']}",
                    backoff=RETRIES,
                )
            except ApiError as exc:
                if exc.status != NOT_FOUND:
                    raise ConfigError(f"{where}: {exc}") from exc
            try:
                await kube.call_with_retries(
                    f"create {where}", raw_call, kube, "POST", collection, manifest, backoff=RETRIES
                )
            except ApiError as exc:
                raise ConfigError(f"{where}: {exc}") from exc
    finally:
        await kube.close()


def _placed(manifest: dict[str, Any]) -> tuple[str, str]:
    """How messages name a manifest's object ("Kind name") and the collection it is created in (cluster-scoped
    or in its ``metadata.namespace``)."""
    meta = manifest.get("metadata") or {}
    where = f"{manifest['kind']} {meta.get('name')}"
    return where, collection_path(str(manifest["apiVersion"]), str(manifest["kind"]), meta.get("namespace"))
