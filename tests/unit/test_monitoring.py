"""Specifications of deploy/monitoring's dashboard and alerts: every PromQL query in the Grafana dashboard
and the PrometheusRule names only series Kairos exports (read from the registries the services build, not
from a list), the rules are well-formed, and the component renders them as kube-prometheus-stack expects
(the dashboard in a ConfigMap its Grafana sidecar loads).

The metric names of a query come from a small PromQL tokenizer (`metric_names`): strings, label matchers,
range and subquery selectors, grouping label lists, Grafana variables, numbers, durations, function names
and keywords are removed; what is left is the metric names."""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.unit.test_deploy_manifests import schema_errors, with_monitoring
from tests.unit.test_metrics_kai import every_service

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"

KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
)
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGE = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_VARIABLE = re.compile(r"\$\{[^}]*\}|\$\w+")
_IDENTIFIER = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*(?=\s*(\()?)")
_NUMBER_OR_DURATION = re.compile(r"\b\d[\w.]*")


def metric_names(query: str) -> set[str]:
    """The metric names a PromQL query selects."""
    text = _VARIABLE.sub(" 1 ", query)
    text = _STRING.sub(" ", text)
    text = _MATCHERS.sub(" ", text)
    text = _RANGE.sub(" ", text)
    text = _GROUPING.sub(" ", text)
    text = _NUMBER_OR_DURATION.sub(" ", text)
    names: set[str] = set()
    for match in _IDENTIFIER.finditer(text):
        word = match.group(0)
        if match.group(1) or word in KEYWORDS:  # a function call, or a keyword
            continue
        names.add(word)
    return names


@pytest.mark.parametrize(
    ("query", "names"),
    [
        ("kai_queue_info", {"kai_queue_info"}),
        ('sum by (job) (kairos_service_ready{job=~"kairos-(state|queue)"}) == 0', {"kairos_service_ready"}),
        (
            "histogram_quantile(0.95, sum by (le) (rate(kai_task_bind_latency_milliseconds_bucket[5m])))",
            {"kai_task_bind_latency_milliseconds_bucket"},
        ),
        ("a_total / on (x, y) group_left (z) b_info", {"a_total", "b_info"}),
        ('absent(x{job="kairos-state"}) or vector(0)', {"x"}),
        ("rate(x[$__rate_interval]) * 1e9 offset 5m", {"x"}),
        ('x{name=~"admission_unforeseen|by"} > bool 2', {"x"}),
        ("max_over_time(deriv(x[10m:1m])[1h:])", {"x"}),
        ("label_values(kai_queue_info, queue_metadata_name)", {"kai_queue_info", "queue_metadata_name"}),
        ('x{a="}"} + y', {"x", "y"}),
    ],
)
def test_the_tokenizer_finds_exactly_the_metric_names(query: str, names: set[str]) -> None:
    assert metric_names(query) == names


# --- what Kairos exports ------------------------------------------------------------------------------------
@cache
def exported() -> frozenset[str]:
    """Every series name the services' registries expose, as PromQL selects it: a counter's name as
    written, a histogram's `_bucket`, `_sum` and `_count`."""
    names: set[str] = set()
    for metrics in every_service().values():
        for line in metrics.expose()[0].decode().splitlines():
            if not line.startswith("# TYPE "):
                continue
            _, _, name, kind = line.split()
            if kind == "histogram":
                names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
            else:
                names.add(name)
    return frozenset(names)


def test_the_exported_set_is_read_from_the_registries() -> None:
    found = exported()
    assert {"kai_podgroups_scheduled_by_action", "kai_queue_gpu_usage", "process_start_time_seconds"} <= found
    assert "kai_podgroups_scheduled_by_action_total" not in found  # KAI's name, as KAI writes it
    assert "kai_task_bind_latency_milliseconds_count" in found


# --- the dashboard ------------------------------------------------------------------------------------------
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((MONITORING / "dashboard.json").read_text())
    return loaded


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, query) for every panel target and query variable."""
    board = dashboard()
    out = [
        (panel["title"], target["expr"]) for panel in board["panels"] for target in panel.get("targets", ())
    ]
    out.extend(
        (f"${variable['name']}", variable["definition"])
        for variable in board["templating"]["list"]
        if variable["type"] == "query"
    )
    return out


def rules() -> list[dict[str, Any]]:
    rule = yaml.safe_load((MONITORING / "alerts.yaml").read_text())
    return [r for group in rule["spec"]["groups"] for r in group["rules"]]


def label_names(query: str) -> set[str]:
    """`label_values(metric, label)`'s label argument is a label, not a series."""
    found = re.match(r"label_values\(\s*[\w:]+\s*,\s*(\w+)\s*\)", query)
    return {found.group(1)} if found else set()


@pytest.mark.parametrize(("where", "query"), dashboard_queries())
def test_every_dashboard_query_names_only_series_kairos_exports(where: str, query: str) -> None:
    names = metric_names(query) - label_names(query)
    assert names, f"{where}: no series in {query!r}"
    assert names <= exported(), f"{where}: {sorted(names - exported())} are not exported"


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_every_alert_names_only_series_kairos_exports(rule: dict[str, Any]) -> None:
    names = metric_names(rule["expr"])
    assert names, rule["alert"]
    assert names <= exported(), f"{rule['alert']}: {sorted(names - exported())} are not exported"


def test_the_check_catches_a_query_on_a_series_nobody_exports() -> None:
    assert not metric_names("rate(kai_pod_group_evicted_pods[5m])") <= exported()


def test_the_dashboard_covers_what_an_operator_watches() -> None:
    queries = " ".join(q for _, q in dashboard_queries())
    for series in (
        "kai_queue_deserved_gpus",
        "kai_queue_fair_share_gpu",
        "kai_queue_allocated_gpus",
        "kai_queue_gpu_usage",
        "kairos_placement_pending_podgroups",
        "kai_task_scheduling_latency_milliseconds_bucket",
        "kairos_queue_work_round_trip_seconds_bucket",
        "kairos_binder_proposal_seconds_bucket",
        "kairos_nats_consumer_pending_messages",
        "process_start_time_seconds",
    ):
        assert series in queries, series


def test_the_dashboard_is_one_grafana_layout() -> None:
    board = dashboard()
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] != "row":
            assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
            assert [t["refId"] for t in panel["targets"]] == [
                chr(65 + i) for i in range(len(panel["targets"]))
            ]
    assert board["uid"] == "kairos-scheduler"


# --- the rules ----------------------------------------------------------------------------------------------
DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


def test_the_rules_raise_the_alerts_an_operator_needs() -> None:
    assert {r["alert"] for r in rules()} >= {
        "KairosPendingGrowingWithoutBinds",
        "KairosServiceNoReadyReplica",
        "KairosStreamLagGrowing",
        "KairosWebhookFailingOpen",
    }


@pytest.mark.parametrize("rule", rules(), ids=lambda r: r["alert"])
def test_each_rule_is_well_formed(rule: dict[str, Any]) -> None:
    assert set(rule) <= {"alert", "expr", "for", "labels", "annotations"}
    assert rule["labels"]["severity"] in {"critical", "warning", "info"}
    assert {"summary", "description"} <= set(rule["annotations"])
    if "for" in rule:
        assert DURATION.match(rule["for"]), rule["for"]
    for window in re.findall(r"\[([^\]]*)\]", rule["expr"]):
        for part in window.split(":"):
            assert part == "" or DURATION.match(part), (rule["alert"], window)
    assert rule["expr"].count("(") == rule["expr"].count(")")


# --- the component ------------------------------------------------------------------------------------------
def rendered() -> tuple[dict[str, Any], ...]:
    return with_monitoring("base")


def test_the_dashboard_ships_in_a_configmap_the_grafana_sidecar_loads() -> None:
    maps = [o for o in rendered() if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "kairos-dashboard"]
    assert len(maps) == 1
    config = maps[0]
    assert config["metadata"]["namespace"] == "kai-scheduler"
    assert config["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(config["data"]["kairos.json"]) == dashboard()
    assert schema_errors((config,)) == []


def test_the_rules_ship_as_a_prometheus_rule_in_kairos_namespace() -> None:
    found = [o for o in rendered() if o["kind"] == "PrometheusRule"]
    assert [(o["apiVersion"], o["metadata"]["name"], o["metadata"]["namespace"]) for o in found] == [
        ("monitoring.coreos.com/v1", "kairos", "kai-scheduler")
    ]
    assert [r["alert"] for g in found[0]["spec"]["groups"] for r in g["rules"]] == [
        r["alert"] for r in rules()
    ]
