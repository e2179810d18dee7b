"""Bind steps: what the binder changes in the cluster before a pod's ``pods/binding`` POST, behind one
protocol (`BindStep`), run in one order fixed at start (`BindSteps`) and taken back in reverse when the
binding does not happen.

Called by `services.binder.kube_client.KubeClusterClient.bind`, which builds its `BindSteps` once, at
start, from its steps and `KubeClusterClient.step_order`. The built-in steps, in their default order (KAI's
binder plugins, whose default priorities 300, 200, 100 run them in this order):

1. ``volumebinding``: `services.binder.volumes.VolumeSteps` (a static volume reserved for its claim, or the
   claim's selected-node set);
2. ``dynamicresources``: `services.binder.claims.ClaimSteps` (resource claims allocated and reserved for
   the pod);
3. ``gpusharing``: `services.binder.gpu_sharing_step.GpuSharing` (the pod labelled as a sharer, a reservation
   pod per shared device, its GPU-sharing ConfigMaps).

A new step is a class with the three methods and a `name`, and one entry in the steps the client builds.
An unknown or repeated name in the order fails at start (`ConfigError`, naming the option and the index).

How `BindSteps.run` goes, for one binding:

- the steps whose `BindStep.applies` says yes prepare, one after another, in the order (an ordinary pod's
  bind prepares nothing);
- a step that raises (a refusal, no answer, anything else) stops the bind: the steps before it are undone,
  newest first, and what it raised propagates with a note naming the step. The step that raised has taken
  back what it did itself (its contract);
- then the binding: a refusal (`ClusterRefused`) undoes every step prepared, newest first, and
  propagates; no answer (`TemporaryError`, or anything else) undoes nothing: the pod may be bound, and
  the recovery scan repeats the bind, whose steps find their work done;
- a bind cancelled part-way (the binder stopped, as a crash would) undoes nothing either; the recovery
  scan, here or in another binder, repeats it.

An undo that raises is logged and counted (``bind_step_undo_errors``) and the other undos still run: the
refusal stands and is what the caller sees.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from services.binder.cluster_client import ClusterRefused
from shared.bus.middleware import Counters
from shared.contracts.messages import Binding
from shared.errors import ConfigError

__all__ = ["DEFAULT_ORDER", "BindStep", "BindSteps"]

log = logging.getLogger("kairos.binder.steps")

DEFAULT_ORDER = ("volumebinding", "dynamicresources", "gpusharing")
"""The built-in steps' order: volumes first (a claim's volume decides nothing else), then resource claims,
then GPU sharing's reservation (the slowest: it waits for a reservation pod's device)."""

Done = TypeVar("Done")


class BindStep(Protocol[Done]):
    """One thing the binder does to the cluster before a pod's binding, and takes back if the pod is not
    bound.

    `name` (a class constant) is how the order names it. The runner calls:

    - `applies(binding)`: whether this binding needs the step at all; pure, no I/O. A step that does not
      apply is neither prepared nor undone.
    - `prepare(binding) -> Done`: make the cluster ready for the binding, and return what `undo` needs to
      take it back. Idempotent: a binding redelivered, or repeated by the recovery scan (in this binder or
      another, after a crash at any point), runs it again, and it must find its own earlier work done, not
      fail on it. It raises `ClusterRefused` when the cluster says no for good (the pod's bind is refused),
      `TemporaryError` when it got no answer or may work later; before raising it takes back what this call
      changed, or its docstring says who does.
    - `undo(done)`: take back what `prepare` returned, after a later step failed or the binding was
      refused. Best effort and idempotent: what is already gone is fine; a failure is logged and counted,
      never raised (the runner guards it all the same, so one failing undo never stops the others).
    """

    @property
    def name(self) -> str: ...

    def applies(self, binding: Binding) -> bool: ...

    async def prepare(self, binding: Binding) -> Done: ...

    async def undo(self, done: Done) -> None: ...


@dataclass(frozen=True)
class BindSteps:
    """The steps of every bind, in order: a value built once, at start (`build`)."""

    steps: tuple[BindStep[Any], ...]
    counters: Counters = field(default_factory=Counters)

    @classmethod
    def build(
        cls,
        order: Sequence[str],
        available: Iterable[BindStep[Any]],
        counters: Counters | None = None,
        *,
        option: str = "bind_steps",
    ) -> BindSteps:
        """The steps `order` names, in its order, from `available` (the steps this binder can run).
        `ConfigError` naming `option` and the index for a name that no step has or that appears twice, and
        for two available steps under one name."""
        known: dict[str, BindStep[Any]] = {}
        for step in available:
            if step.name in known:
                raise ConfigError(f"{option}: two steps are named {step.name!r}")
            known[step.name] = step
        chosen: list[BindStep[Any]] = []
        for index, name in enumerate(order):
            if name not in known:
                raise ConfigError(
                    f"{option}[{index}]: unknown step {name!r} (known: {', '.join(sorted(known))})"
                )
            if any(step.name == name for step in chosen):
                raise ConfigError(f"{option}[{index}]: step {name!r} is listed twice")
            chosen.append(known[name])
        return cls(tuple(chosen), Counters() if counters is None else counters)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    async def run(self, binding: Binding, bind: Callable[[Binding], Awaitable[None]]) -> None:
        """Prepare the steps that apply, then `bind`; undo as the module docstring says."""
        done: list[tuple[BindStep[Any], Any]] = []
        for step in self.steps:
            if not step.applies(binding):
                continue
            try:
                result = await step.prepare(binding)
            except Exception as exc:
                exc.add_note(f"in bind step {step.name} of pod {binding.pod}")
                if isinstance(exc, ClusterRefused) and not exc.step:
                    exc.step = step.name
                await self.undo(done)
                raise
            done.append((step, result))
        try:
            await bind(binding)
        except ClusterRefused:
            await self.undo(done)
            raise

    async def undo(self, done: Sequence[tuple[BindStep[Any], Any]]) -> None:
        """Undo each (step, what its prepare returned), newest first; a failure is logged and counted."""
        for step, result in reversed(done):
            try:
                await step.undo(result)
            except Exception as exc:  # noqa: BLE001 -- an undo that fails must not hide the refusal
                self.counters["bind_step_undo_errors"] += 1
                log.warning("could not undo bind step %s: %s", step.name, exc)
