"""What the wire objects of a family of kinds read by resource name share: the storage kinds of
`shared.kube.volumes` and the DRA kinds of `shared.kube.dra`.

`WireStruct` is the base of their structs (camelCase names, keyword construction, immutable), `WireObject`
of their objects (Kubernetes' TypeMeta and ObjectMeta, the kind's name and how errors name the object), and
`decoder` reads one object of a resource from its JSON, raising `InvalidObject` with the kind and the
object's name when it does not decode. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar, TypeVar

import msgspec

from shared.errors import InvalidObject
from shared.kube import wire

__all__ = ["WireObject", "WireStruct", "decoder"]


class WireStruct(msgspec.Struct, rename="camel", frozen=True, kw_only=True, omit_defaults=True):
    """Base of a family's wire structs."""


class WireObject(WireStruct, frozen=True, kw_only=True):
    """Base of a family's objects; each kind sets `KIND`, its name in errors."""

    KIND: ClassVar[str]
    api_version: str = ""
    kind: str = ""
    metadata: wire.ObjectMeta = msgspec.field(default_factory=wire.ObjectMeta)

    @property
    def label(self) -> str:
        """How errors name it: "namespace/name", or the name alone when cluster-scoped."""
        return wire.object_name(self.metadata.namespace, self.metadata.name)


T = TypeVar("T", bound=WireObject)


def decoder(kinds: Mapping[str, type[T]]) -> Callable[[str, bytes | str], T]:
    """The decoding of one object of a resource (a key of `kinds`, resource name -> wire type) from its JSON;
    InvalidObject names the kind, the object (when its metadata can be read) and the problem."""
    decoders = {resource: msgspec.json.Decoder(cls) for resource, cls in kinds.items()}

    def decode(resource: str, data: bytes | str) -> T:
        try:
            obj: T = decoders[resource].decode(data)
        except msgspec.MsgspecError as exc:
            raise InvalidObject(kinds[resource].KIND, _name_in(data), "", str(exc)) from exc
        return obj

    return decode


class _Named(msgspec.Struct):
    metadata: wire.ObjectMeta | None = None


def _name_in(data: bytes | str) -> str:
    try:
        meta = msgspec.json.decode(data, type=_Named).metadata
    except msgspec.MsgspecError:
        return ""
    return "" if meta is None else wire.object_name(meta.namespace, meta.name)
