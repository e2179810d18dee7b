"""Fault injection for the simulated API server: which requests fail, how, and what was injected.

The chaos suite (`tools.chaos`) and the fault tests drive it; the HTTP shell (`tools.kubesim.server`)
asks `Faults.pick(verb, resource, resume=...)` once per resource request and applies the answer: wait
`delay` seconds, then answer `status` (500, 503 or 429 with a Retry-After header) instead of doing the
request, or, for a watch that resumes from a resourceVersion, answer the 410 Expired ERROR event a real
server sends when the version left its window. Dropping the open watches is an action, not a rule: the
shell closes every stream of a resource at once (`POST /kubesim/faults/drop-watches`).

A plan is a msgspec value (`FaultPlan`) read from `--faults FILE` at start and replaced at run time by
`POST /kubesim/faults`; `GET /kubesim/faults` returns the plan and how many faults each rule injected.
Verbs and resources are Kubernetes' own (`create` on `pods/binding` is a bind, `list` and `watch` are a
collection GET). Pure apart from the random draw, whose generator is seeded from the plan.
"""

from __future__ import annotations

import random
from pathlib import Path

import msgspec

from shared.errors import ConfigError

__all__ = ["VERBS", "Fault", "FaultPlan", "FaultRule", "Faults", "read_plan", "read_plan_file", "verb_of"]

VERBS = frozenset(("get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "*"))
STATUSES = frozenset((0, 410, 429, 500, 502, 503, 504))


class FaultRule(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Requests of `verb` on `resource` (`*`: any) fail or slow down with probability `fraction`."""

    verb: str = "*"
    resource: str = "*"
    """A plural (`pods`), a subresource (`pods/binding`) or `*`."""
    fraction: float = 1.0
    status: int = 0
    """0: answer normally (after `delay`); 500/502/503/504, 429 (with Retry-After); 410: only for a watch
    resume (an ERROR event with a 410 Expired Status, as when the version left the window)."""
    retry_after: int = 1
    """Seconds in the Retry-After header of a 429."""
    delay: float = 0.0
    """Seconds to wait before answering (a slow API server)."""
    limit: int = -1
    """How many requests this rule may hit in all (-1: no limit)."""

    def __post_init__(self) -> None:
        # ValueError: msgspec reports it with the rule's path in the plan ($.rules[2]).
        where = f"fault rule {self.verb} {self.resource}"
        if self.verb not in VERBS:
            raise ValueError(f"{where}: verb: expected one of {sorted(VERBS)}, got {self.verb!r}")
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"{where}: fraction: must be in [0, 1], got {self.fraction}")
        if self.status not in STATUSES:
            raise ValueError(f"{where}: status: expected one of {sorted(STATUSES)}, got {self.status}")
        if self.status == 410 and self.verb not in ("watch", "*"):
            raise ValueError(f"{where}: status: 410 is only answered to a watch resume")
        if self.delay < 0 or self.retry_after < 0:
            raise ValueError(f"{where}: delay and retry_after must be >= 0")


class FaultPlan(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The rules in order (the first that matches and fires decides) and the seed of the random draw."""

    rules: tuple[FaultRule, ...] = ()
    seed: int | None = None


class Fault(msgspec.Struct, frozen=True):
    """What to do to one request: wait `delay`, then answer `status` (0: serve it)."""

    status: int
    delay: float
    retry_after: int
    rule: int
    """The index of the rule that fired."""


_PLAN = msgspec.json.Decoder(FaultPlan)


def read_plan(data: bytes | str, source: str = "fault plan") -> FaultPlan:
    """A plan from JSON (or YAML, which is a superset for these files); errors name `source` and field."""
    text = data.decode() if isinstance(data, bytes) else data
    try:
        return _PLAN.decode(text)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{source}: {exc}") from exc
    except msgspec.DecodeError:
        pass
    import yaml  # only a YAML file gets here

    try:
        loaded = yaml.safe_load(text)
        return msgspec.convert(loaded or {}, FaultPlan)
    except (yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ConfigError(f"{source}: {' '.join(str(exc).split())}") from exc


def read_plan_file(path: str | Path) -> FaultPlan:
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"--faults: cannot read {path}: {exc.strerror}") from exc
    return read_plan(data, str(path))


def verb_of(method: str, name: str | None, watch: bool) -> str:
    """The Kubernetes verb of an HTTP request on a resource."""
    if method in ("GET", "HEAD"):
        if name is not None:
            return "get"
        return "watch" if watch else "list"
    if method == "POST":
        return "create"
    if method == "PUT":
        return "update"
    if method == "PATCH":
        return "patch"
    if method == "DELETE":
        return "delete" if name is not None else "deletecollection"
    return method.lower()


class Faults:
    """The plan in force, its random draw and what it injected (per rule, and per status)."""

    def __init__(self, plan: FaultPlan | None = None) -> None:
        self.plan = FaultPlan()
        self.rng = random.Random()
        self.hits: list[int] = []
        self.injected: dict[str, int] = {}
        """Injected faults by kind (`500`, `429`, `410`, `delay`, `dropped-watch`) since the start."""
        self.set_plan(plan or FaultPlan())

    def set_plan(self, plan: FaultPlan) -> None:
        self.plan = plan
        self.rng = random.Random(plan.seed)
        self.hits = [0] * len(plan.rules)

    def pick(self, verb: str, resource: str, *, resume: bool = False) -> Fault | None:
        """The fault for one request, or None. A 410 rule applies only to a watch `resume` (a watch from a
        resourceVersion); other watches and requests pass it by."""
        rules = self.plan.rules
        if not rules:
            return None
        for i, rule in enumerate(rules):
            if rule.verb not in ("*", verb) or rule.resource not in ("*", resource):
                continue
            if rule.status == 410 and not (verb == "watch" and resume):
                continue
            if 0 <= rule.limit <= self.hits[i]:
                continue
            if rule.fraction < 1.0 and self.rng.random() >= rule.fraction:
                continue
            self.hits[i] += 1
            if rule.delay > 0:
                self.count("delay")
            if rule.status:
                self.count(str(rule.status))
            return Fault(rule.status, rule.delay, rule.retry_after, i)
        return None

    def count(self, kind: str, n: int = 1) -> None:
        self.injected[kind] = self.injected.get(kind, 0) + n

    def report(self) -> dict[str, object]:
        """What `GET /kubesim/faults` answers."""
        return {
            "plan": msgspec.to_builtins(self.plan),
            "hits": list(self.hits),
            "injected": dict(self.injected),
        }
