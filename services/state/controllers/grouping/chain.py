"""The owner chain: which owner to fetch next, and the check that a fetched chain is the pod's own.

`owner_refs_to_follow` is called by the pod-grouper loop (`services.state.controllers.podgrouper`) and the webhook
(`services.state.webhook.webhook`) to walk a pod's owners; `check_chain` by `decision.group_pod` before any plugin
reads the chain.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.state.controllers.grouping.fields import owner_error
from services.state.controllers.grouping.model import OwnerRef
from shared.errors import InvalidObject
from shared.kube import wire


def owner_refs_to_follow(obj: wire.Pod | wire.Owner) -> list[OwnerRef]:
    """The owner to fetch next: a pod's first owner reference, an owner's only one; [] at the top.

    An owner with several owners is an error, as in KAI (the chain would be ambiguous).
    """
    refs = obj.metadata.owner_references
    if not refs:
        return []
    if isinstance(obj, wire.Owner) and len(refs) > 1:
        name = wire.object_name(obj.metadata.namespace, obj.metadata.name)
        raise InvalidObject(obj.kind or "owner", name, "metadata.ownerReferences", "has several owners")
    ref = refs[0]
    return [OwnerRef(ref.api_version, ref.kind, ref.name, ref.uid)]


def check_chain(pod: wire.Pod, owners: Sequence[wire.Owner]) -> None:
    """Each owner must be the object its child references (same kind, name and uid)."""
    child: wire.Pod | wire.Owner = pod
    for owner in owners:
        refs = owner_refs_to_follow(child)
        if not refs:
            raise owner_error(owner, "", "is not an owner of the object below it in the chain")
        ref = refs[0]
        if (
            ref.kind != owner.kind
            or ref.name != owner.metadata.name
            or (ref.uid and ref.uid != owner.metadata.uid)
        ):
            raise owner_error(
                owner,
                "metadata.uid",
                f"expected {ref.kind} {ref.name!r} with uid {ref.uid!r} (the owner was replaced?)",
            )
        child = owner
