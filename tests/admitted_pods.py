"""Test data as the API server stores it after Kairos's admission webhook: `admitted(doc)` applies the
webhook's GPU-sharing patch (`shared.kube.gpu_sharing.admission_patch`) to a pod document, with kubesim's
JSON-patch implementation standing in for the API server's. Used by specs that build fractional pods."""

from __future__ import annotations

import copy
from typing import Any

from shared.kube import gpu_sharing, wire
from tools.kubesim.patch import json_patch

RANDOM = "tst4bcd"
"""The webhook's random ConfigMap-name part, fixed so that names are predictable in specs."""


def admitted(doc: dict[str, Any]) -> dict[str, Any]:
    """The pod document after admission (unchanged when the pod is not fractional)."""
    patch = gpu_sharing.admission_patch(wire.convert(wire.Pod, doc), RANDOM)
    return json_patch(copy.deepcopy(doc), patch) if patch else doc
