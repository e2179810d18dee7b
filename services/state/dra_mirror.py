"""The DRA objects the state service mirrors: DeviceClasses, ResourceSlices, ResourceClaims and
ResourceClaimTemplates, as the model objects KV holds (`shared.model.dra`).

Fed by the DRA informers (`services.state.dra_watch`: `relist` per list, `change` per watch event) and
drained by the mirror's flush (`services.state.mirror.Mirror.dra`): `objects` for a full flush, `drain`
for the keys that changed since the last one. Translation is `shared.kube.dra`'s. A class, claim or
template that does not decode or translate is kept under its name with its problem (a pod that uses it is
held with those words by the core); a slice that does not is left out and its problem kept in `problems`
for the owner's log, and nothing else is affected. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from services.state.kv_objects import key_of
from shared.errors import InvalidObject
from shared.kube import dra as kd
from shared.model.dra import DeviceClass, DraObject, ResourceClaim, ResourceClaimTemplate

__all__ = ["RESOURCES", "DraMirror"]

RESOURCES = tuple(kd.KINDS)
"""The resources mirrored: deviceclasses, resourceslices, resourceclaims, resourceclaimtemplates."""


@dataclass
class DraMirror:
    """DRA objects by resource and "namespace/name", translated, and the KV keys that changed."""

    objects: dict[str, DraObject] = field(default_factory=dict)
    """KV key -> the object KV should hold."""
    problems: dict[str, str] = field(default_factory=dict)
    """"resource namespace/name" -> why it is not used (decoding or translation)."""
    dirty: set[str] = field(default_factory=set)
    """KV keys whose object came, went or changed since the last `drain`."""
    _keys: dict[tuple[str, str], str] = field(default_factory=dict)

    def relist(self, resource: str, items: Iterable[bytes]) -> None:
        """Replace everything held of `resource` by a fresh list."""
        fresh: dict[str, DraObject | None] = {}
        for data in items:
            name, obj = self._translate(resource, data)
            if name:
                fresh[name] = obj
        for kind, name in [k for k in self._keys if k[0] == resource and k[1] not in fresh]:
            self._drop(kind, name)
        for name, obj in fresh.items():
            self._put(resource, name, obj)

    def change(self, resource: str, event: str, data: bytes) -> None:
        """One watch event: ADDED, MODIFIED or DELETED."""
        name, obj = self._translate(resource, data)
        if not name:
            return
        if event == "DELETED":
            self._drop(resource, name)
            self.problems.pop(f"{resource} {name}", None)
        else:
            self._put(resource, name, obj)

    def drain(self) -> dict[str, DraObject | None]:
        """What changed since the last drain, by KV key (None: gone)."""
        out = {key: self.objects.get(key) for key in self.dirty}
        self.dirty.clear()
        return out

    def _put(self, resource: str, name: str, obj: DraObject | None) -> None:
        if obj is None:
            self._drop(resource, name)
            return
        key = key_of(obj)
        old = self._keys.get((resource, name))
        if old is not None and old != key:
            self._drop(resource, name)
        self._keys[(resource, name)] = key
        if self.objects.get(key) != obj:
            self.objects[key] = obj
            self.dirty.add(key)

    def _drop(self, resource: str, name: str) -> None:
        key = self._keys.pop((resource, name), None)
        if key is not None and self.objects.pop(key, None) is not None:
            self.dirty.add(key)

    def _translate(self, resource: str, data: bytes) -> tuple[str, DraObject | None]:
        """("namespace/name", the model object or None when it is not used); ("", None) when not even the
        name can be read."""
        label = f"{resource} "
        try:
            raw = kd.decode(resource, data)
        except InvalidObject as exc:
            self.problems[label + exc.name] = str(exc)
            return exc.name, _with_problem(resource, exc)
        name = raw.label
        try:
            obj = _model(raw)
        except InvalidObject as exc:
            self.problems[label + name] = str(exc)
            return name, None
        except Exception as exc:  # noqa: BLE001 -- one object's content must never stop the feed of the others
            self.problems[label + name] = f"cannot be translated ({type(exc).__name__}: {exc})"
            return name, None
        self.problems.pop(label + name, None)
        return name, obj


def _model(raw: kd.WireDra) -> DraObject:
    match raw:
        case kd.WireDeviceClass():
            return kd.class_of(raw)
        case kd.WireResourceSlice():
            return kd.slice_of(raw)
        case kd.WireClaim():
            return kd.claim_of(raw)
        case kd.WireClaimTemplate():
            return kd.template_of(raw)


def _with_problem(resource: str, exc: InvalidObject) -> DraObject | None:
    """A class, claim or template that does not decode, kept under its name with the problem."""
    namespace, _, name = exc.name.rpartition("/")
    if not name:
        return None
    if resource == "deviceclasses":
        return DeviceClass(name=name, problem=str(exc))
    if resource == "resourceclaims":
        return ResourceClaim(name=name, namespace=namespace, problem=str(exc))
    if resource == "resourceclaimtemplates":
        return ResourceClaimTemplate(name=name, namespace=namespace, problem=str(exc))
    return None
