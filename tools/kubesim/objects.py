"""Small helpers over Kubernetes objects held as JSON-like dicts (camelCase, as the API serialises them).

Used by every part of the simulated API server: copying (`clone`), timestamps (`rfc3339`, `parse_time`),
generated names and uids, owner references, and resource quantities (`quantity`, enough for the built-in
default scheduler and the node converter). Pure: no I/O.
"""

from __future__ import annotations

import datetime as dt
import functools
import random
from fractions import Fraction
from typing import Any

import msgspec

from shared.kube.quantity import QuantityError, parse_quantity

__all__ = [
    "MAX_COUNT",
    "NAME_ALPHABET",
    "Obj",
    "clone",
    "condition",
    "controller_of",
    "controller_ref",
    "count_of",
    "format_cpu",
    "format_memory",
    "is_ready",
    "labels_of",
    "meta",
    "new_uid",
    "parse_time",
    "put_condition",
    "quantity",
    "random_suffix",
    "rfc3339",
]

Obj = dict[str, Any]

NAME_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
"""The characters Kubernetes uses for generated name suffixes (no vowels, no confusable digits)."""

_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


MAX_COUNT = 1000
"""The most pods a simulated controller keeps for one object: kubesim has no schema to refuse a hostile
count, and a count of a billion would fill its memory."""


def count_of(spec: Any, key: str, default: int) -> int:
    """A count in a spec (``replicas``, ``parallelism``...), `default` when absent; what the real API server's
    schema (an int32 >= 0) would refuse (text, a bool, a float, a negative) counts 0, and a count beyond
    `MAX_COUNT` counts that many."""
    raw = spec.get(key, default) if isinstance(spec, dict) else default
    if raw is None:
        raw = default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        return 0
    return min(raw, MAX_COUNT)


def clone(obj: Any) -> Any:
    """A deep copy of JSON-like data (faster than `copy.deepcopy` for this shape)."""
    return _decoder.decode(_encoder.encode(obj))


def meta(obj: Obj) -> Obj:
    """The object's metadata (an empty dict when it has none; the caller must not keep it)."""
    m = obj.get("metadata")
    return m if isinstance(m, dict) else {}


def labels_of(obj: Obj) -> dict[str, str]:
    labels = meta(obj).get("labels")
    return labels if isinstance(labels, dict) else {}


@functools.lru_cache(maxsize=64)
def _rfc3339_second(second: int) -> str:
    return dt.datetime.fromtimestamp(second, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rfc3339(epoch: float) -> str:
    """`epoch` seconds as Kubernetes writes timestamps: UTC, second precision, `Z` (one string per second,
    shared by every object written in it)."""
    return _rfc3339_second(int(epoch))


def rfc3339_micro(epoch: float) -> str:
    """`epoch` as a MicroTime (events.k8s.io eventTime, lease renewTime)."""
    return dt.datetime.fromtimestamp(epoch, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: Any) -> float | None:
    """Epoch seconds of an RFC 3339 timestamp, None when absent or unreadable."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return dt.datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


_UUID_VERSION_CLEAR = ~((0xC000 << 48) | (0xF000 << 64))
_UUID_VERSION_SET = (0x8000 << 48) | (4 << 76)


def new_uid(rng: random.Random) -> str:
    """A random (version 4) UUID drawn from `rng`, as `str(uuid.UUID(int=..., version=4))` writes it
    (formatted here directly: a third of the time, and one is drawn per object created)."""
    digits = "%032x" % (rng.getrandbits(128) & _UUID_VERSION_CLEAR | _UUID_VERSION_SET)
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"


def random_suffix(rng: random.Random, n: int = 5) -> str:
    return "".join(rng.choice(NAME_ALPHABET) for _ in range(n))


def controller_ref(owner: Obj, api_version: str = "") -> Obj:
    """The ownerReference a controller puts on what it creates for `owner` (a stored object, which carries
    its apiVersion and kind): ``controller: true`` and ``blockOwnerDeletion: true``, as Kubernetes's
    controllers and the operators write it. `api_version`, when given, is named instead of the owner's
    (an operator that names its kind's storage version whichever version the owner was written in)."""
    md = owner["metadata"]
    return {
        "apiVersion": api_version or owner["apiVersion"],
        "kind": owner["kind"],
        "name": md["name"],
        "uid": md.get("uid", ""),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def is_ready(obj: Obj) -> bool:
    """Whether the object's (a pod's, a node's) Ready condition is True."""
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in (obj.get("status") or {}).get("conditions") or ()
    )


def condition(type_: str, status: str, reason: str, message: str, **times: str) -> Obj:
    """A status condition; `times` are its timestamps by field (``lastTransitionTime``, with
    ``lastProbeTime`` or ``lastUpdateTime`` where the kind's condition type has one)."""
    return {"type": type_, "status": status, "reason": reason, "message": message, **times}


def put_condition(conditions: list[Obj], new: Obj) -> None:
    """Set `new` in `conditions`, in place, as Kubernetes's Job controller, JobSet's and Kubeflow Training's
    set theirs: the condition of its type takes it when the status changes; a True one is added when there
    is none of its type, a False one only replaces one that is there."""
    for c in conditions:
        if c.get("type") == new["type"]:
            if c.get("status") != new["status"]:
                c.update(new)
            return
    if new["status"] == "True":
        conditions.append(new)


def controller_of(obj: Obj) -> Obj | None:
    """The owner reference with `controller: true`, if any."""
    for ref in meta(obj).get("ownerReferences") or ():
        if isinstance(ref, dict) and ref.get("controller"):
            return ref
    return None


def quantity(value: Any) -> Fraction | None:
    """A resource quantity ("100m", "2", "1.5Gi", "1e3") as an exact number, None when it does not parse."""
    if not isinstance(value, str | int | float):
        return None
    try:
        return parse_quantity(value)
    except QuantityError:
        return None


def format_cpu(millis: float) -> str:
    """CPU as the API server serialises it: whole cores plain ("64"), else millicores ("1500m")."""
    m = round(millis)
    return str(m // 1000) if m % 1000 == 0 else f"{m}m"


def format_memory(n_bytes: float) -> str:
    """Bytes as the API server serialises them: the largest exact binary suffix ("512Gi"), else plain."""
    b = round(n_bytes)
    for suffix, factor in (
        ("Ei", 2**60),
        ("Pi", 2**50),
        ("Ti", 2**40),
        ("Gi", 2**30),
        ("Mi", 2**20),
        ("Ki", 2**10),
    ):
        if b and b % factor == 0:
            return f"{b // factor}{suffix}"
    return str(b)
