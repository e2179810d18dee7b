"""docs/kai-compatibility.md stays true: its one table names KAI's features by the version that brought them
(v0.10 to v0.17) and what Kairos does about each, and every claim there can be checked here.

- Every row's "Where" names things that exist: files of the repository (code, tests, examples), the core's
  plugins (`plugin:NAME`, `shared.core.builtin_plugins.DEFAULT_REGISTRY`) and actions (`action:NAME`), the
  pod-grouper's kinds (`kind:KIND`, `services.state.controllers.grouping.registry.PLUGINS`).
- A feature Kairos has ("yes" or "partial") names at least one test; one it lacks ("no") says why.
- Nothing registered is left out: every plugin, action and grouped kind appears in some row.
- The conformance row's counts are the corpus's, and no case sits on a known-failure list.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from services.state.controllers.grouping.registry import PLUGINS
from shared.core.builtin_plugins import DEFAULT_REGISTRY
from shared.core.policy import KNOWN_ACTIONS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "kai-compatibility.md"
CORPUS = ROOT / "tests" / "conformance" / "kai"
VERSIONS = ("v0.10", "v0.12", "v0.13", "v0.14", "v0.15", "v0.16", "v0.17")
"""KAI's minor releases from v0.10 to v0.17 (there was no v0.11)."""
_TOKEN = re.compile(r"`([^`]+)`")
_CORPUS_CLAIM = re.compile(r"(\d+) integration cases, (\d+) action cases and (\d+) configured action cases")


class Row:
    def __init__(self, line: str) -> None:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        assert len(cells) == 4, f"a row has four cells (since, feature, Kairos, where): {line!r}"
        self.since, self.feature, self.kairos, self.where = cells
        self.tokens = _TOKEN.findall(self.where)

    def __repr__(self) -> str:
        return f"{self.since} {self.feature}"


def rows() -> list[Row]:
    lines = DOC.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| Since"))
    table = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        table.append(Row(line))
    return table


ROWS = rows()


def test_the_table_runs_from_v0_10_to_v0_17_in_order() -> None:
    order = [VERSIONS.index(r.since.removeprefix("≤")) for r in ROWS]
    assert order == sorted(order)
    assert {r.since.removeprefix("≤") for r in ROWS} == set(VERSIONS)


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_every_name_in_a_row_exists(row: Row) -> None:
    assert row.tokens, f"{row}: names nothing to check"
    for token in row.tokens:
        kind, _, name = token.partition(":")
        if kind == "plugin" and name:
            assert name in DEFAULT_REGISTRY, f"{row}: no plugin {name!r}"
        elif kind == "action" and name:
            assert name in KNOWN_ACTIONS, f"{row}: no action {name!r}"
        elif kind == "kind" and name:
            assert name in {gvk[2] for gvk in PLUGINS}, f"{row}: the pod-grouper groups no {name!r}"
        else:
            assert (ROOT / token).exists(), f"{row}: {token} does not exist"


@pytest.mark.parametrize("row", ROWS, ids=repr)
def test_what_kairos_has_names_a_test_and_what_it_lacks_says_why(row: Row) -> None:
    verdict = row.kairos.split(":", 1)[0].split(" ", 1)[0].strip("*").lower()
    assert verdict in {"yes", "partial", "no"}, f"{row}: the Kairos cell starts with yes, partial or no"
    if verdict == "no":
        assert len(row.kairos) > len("no: "), f"{row}: says why not"
    else:
        assert any(t.startswith("tests/") for t in row.tokens), f"{row}: names no test"
    if verdict == "partial":
        assert ":" in row.kairos, f"{row}: says what is missing"


def test_every_plugin_action_and_grouped_kind_is_in_the_table() -> None:
    named = {t for r in ROWS for t in r.tokens}
    registered = (
        {f"plugin:{n}" for n in DEFAULT_REGISTRY}
        | {f"action:{a}" for a in KNOWN_ACTIONS}
        | {f"kind:{gvk[2]}" for gvk in PLUGINS}
    )
    missing = sorted(registered - named)
    assert not missing, f"registered but not in docs/kai-compatibility.md: {missing}"


def test_the_conformance_claim_is_the_corpus_and_nothing_is_excused() -> None:
    claim = _CORPUS_CLAIM.search(DOC.read_text(encoding="utf-8"))
    assert claim is not None, "the document states the corpus it passes"
    counts = tuple(len(list((CORPUS / f).rglob("*.yaml"))) for f in ("cases", "actions", "actions-config"))
    assert tuple(int(n) for n in claim.groups()) == counts
    for known in sorted((ROOT / "tests" / "conformance").glob("known_failures*.yaml")):
        assert not yaml.safe_load(known.read_text(encoding="utf-8")), f"{known.name} lists cases"
