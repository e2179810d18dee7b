"""Specs for stages with dependencies (`services.state.mirror.dependencies`): the `kairos.io/after` annotation and
the verdict for every podgroup that has one."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.state.mirror.dependencies import Decision, Phase, Ref, Stage, Verdict, evaluate, parse_after
from shared.errors import InvalidObject


def stage(name: str, phase: Phase = Phase.PENDING, after: str = "", owner: str = "", ns: str = "ml") -> Stage:
    return Stage(
        namespace=ns,
        name=name,
        owner=owner,
        phase=phase,
        after=parse_after(after, ns, name=name) if after else (),
    )


def verdicts(*stages: Stage) -> dict[str, Decision]:
    decided = evaluate({Ref(s.namespace, s.name): s for s in stages})
    return {str(k): v for k, v in decided.items()}


def test_the_annotation_lists_names_in_the_dependants_namespace_or_another() -> None:
    assert parse_after(" preprocess , team-b/tokenize,preprocess", "ml") == (
        Ref("ml", "preprocess"),
        Ref("team-b", "tokenize"),
    )


@pytest.mark.parametrize("value", ["a,,b", "", "a/b/c", "/x", "ns/"])
def test_a_malformed_entry_names_the_annotation(value: str) -> None:
    with pytest.raises(InvalidObject) as caught:
        parse_after(value, "ml", name="train")
    assert caught.value.name == "train"
    assert caught.value.field == "metadata.annotations[kairos.io/after]"


def test_a_stage_waits_until_its_dependency_succeeded_then_is_ready() -> None:
    running = verdicts(stage("pg-pre", Phase.RUNNING, owner="preprocess"), stage("train", after="preprocess"))
    assert running["ml/train"] == Decision(
        verdict=Verdict.WAITING, reason="waiting for ml/preprocess (running) to succeed"
    )
    done = verdicts(stage("pg-pre", Phase.SUCCEEDED, owner="preprocess"), stage("train", after="preprocess"))
    assert done["ml/train"].verdict == Verdict.READY
    assert "ml/pg-pre" not in done, "only podgroups with dependencies get a verdict"


def test_a_dependency_that_does_not_exist_yet_is_waited_for() -> None:
    decided = verdicts(stage("train", after="preprocess"))
    assert decided["ml/train"].reason == "waiting for ml/preprocess (does not exist yet) to succeed"


def test_a_failed_dependency_blocks_its_dependants_down_the_chain() -> None:
    decided = verdicts(
        stage("preprocess", Phase.FAILED),
        stage("train", after="preprocess"),
        stage("serve", after="train"),
    )
    assert decided["ml/train"] == Decision(verdict=Verdict.BLOCKED, reason="ml/preprocess failed")
    assert decided["ml/serve"] == Decision(
        verdict=Verdict.BLOCKED, reason="ml/train is blocked: ml/preprocess failed"
    )


def test_a_cycle_is_refused_and_named_in_full_and_blocks_what_depends_on_it() -> None:
    decided = verdicts(
        stage("a", after="c"),
        stage("b", after="a"),
        stage("c", after="b"),
        stage("d", after="a"),
        stage("self", after="self"),
    )
    assert decided["ml/a"] == Decision(
        verdict=Verdict.CYCLE, reason="dependency cycle: ml/a -> ml/c -> ml/b -> ml/a"
    )
    assert decided["ml/b"].reason == "dependency cycle: ml/b -> ml/a -> ml/c -> ml/b"
    assert decided["ml/c"].verdict == Verdict.CYCLE
    assert decided["ml/d"].verdict == Verdict.BLOCKED
    assert "dependency cycle" in decided["ml/d"].reason
    assert decided["ml/self"].reason == "dependency cycle: ml/self -> ml/self"


names = st.sampled_from([f"s{i}" for i in range(6)])


@settings(derandomize=True, max_examples=200)
@given(
    st.dictionaries(names, st.tuples(st.sampled_from(list(Phase)), st.lists(names, max_size=3)), max_size=6)
)
def test_every_dependant_gets_one_consistent_verdict(graph: dict[str, tuple[Phase, list[str]]]) -> None:
    """Whatever the graph: ready exactly when every dependency exists and succeeded and none is on a
    cycle; a cycle verdict only for stages on one; blocked only with a failed or blocked dependency."""
    stages = {
        Ref("ml", name): Stage(
            namespace="ml", name=name, phase=phase, after=tuple(Ref("ml", d) for d in dict.fromkeys(deps))
        )
        for name, (phase, deps) in graph.items()
    }
    decided = evaluate(stages)
    assert set(decided) == {k for k, s in stages.items() if s.after}
    for key, decision in decided.items():
        deps = [stages.get(r) for r in stages[key].after]
        if decision.verdict == Verdict.READY:
            assert all(d is not None and d.phase == Phase.SUCCEEDED for d in deps)
            assert all(
                decided.get(Ref("ml", d.name), Decision(verdict=Verdict.READY)).verdict
                not in (Verdict.CYCLE, Verdict.BLOCKED)
                for d in deps
                if d is not None
            )
        elif decision.verdict == Verdict.CYCLE:
            assert decision.reason.startswith(f"dependency cycle: {key} -> ")
            assert decision.reason.endswith(f" -> {key}")
        elif decision.verdict == Verdict.BLOCKED:
            assert any(
                d is not None
                and (
                    d.phase == Phase.FAILED
                    or decided.get(Ref("ml", d.name), Decision(verdict=Verdict.READY)).verdict
                    in (Verdict.BLOCKED, Verdict.CYCLE)
                )
                for d in deps
            )
        else:
            assert any(d is None or d.phase != Phase.SUCCEEDED for d in deps)


def test_a_cycle_between_workloads_is_named_by_the_workloads_not_their_generated_podgroups() -> None:
    decided = verdicts(
        stage("pg-ping-1", after="pong", owner="ping"),
        stage("pg-pong-2", after="ping", owner="pong"),
    )
    assert decided["ml/pg-ping-1"].reason == "dependency cycle: ml/ping -> ml/pong -> ml/ping"
