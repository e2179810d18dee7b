"""The DRA objects the state service mirrors: DeviceClasses, ResourceSlices, ResourceClaims and
ResourceClaimTemplates, as the model objects KV holds (`shared.model.dra`).

Fed by the DRA informers (`services.state.sources.dra_watch`: `relist` per list, `change` per watch event) and
drained by the mirror's flush (`services.state.mirror.cache.Mirror.dra`); the feed and the drain are
`services.state.mirror.object_mirror`'s, the reading `shared.kube.dra`'s. A class, claim or template that does
not decode or translate is kept under its name with its problem (a pod that uses it is held with those
words by the core); a slice that does not is left out and its problem kept in `problems` for the owner's
log, and nothing else is affected. Pure: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.state.mirror.object_mirror import ObjectMirror
from shared.kube import dra as kd
from shared.model.dra import DeviceClass, DraObject, ResourceClaim, ResourceClaimTemplate

__all__ = ["RESOURCES", "DraMirror"]

RESOURCES = tuple(kd.KINDS)
"""The resources mirrored: deviceclasses, resourceslices, resourceclaims, resourceclaimtemplates."""


@dataclass
class DraMirror(ObjectMirror[kd.WireDra, DraObject]):
    """DRA objects by resource and "namespace/name", translated, and the KV keys that changed."""

    def decode(self, resource: str, data: bytes) -> kd.WireDra:
        return kd.decode(resource, data)

    def model(self, raw: kd.WireDra) -> DraObject:
        match raw:
            case kd.WireDeviceClass():
                return kd.class_of(raw)
            case kd.WireResourceSlice():
                return kd.slice_of(raw)
            case kd.WireClaim():
                return kd.claim_of(raw)
            case kd.WireClaimTemplate():
                return kd.template_of(raw)

    def undecoded(self, resource: str, namespace: str, name: str, problem: str) -> DraObject | None:
        """A class, claim or template that does not decode, kept under its name with the problem."""
        if resource == "deviceclasses":
            return DeviceClass(name=name, problem=problem)
        if resource == "resourceclaims":
            return ResourceClaim(name=name, namespace=namespace, problem=problem)
        if resource == "resourceclaimtemplates":
            return ResourceClaimTemplate(name=name, namespace=namespace, problem=problem)
        return None
