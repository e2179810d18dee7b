"""JobSets in the simulated cluster: the CRD is served from the start and a simulated JobSet controller
creates each replicated job's batch Jobs, named, labelled and owned as JobSet's controller does, whose pods
kubesim's Job controller creates; InOrder waits for each replicated job to be ready; the status follows
the success and failure policies; a malformed spec creates nothing and says why in a Warning Event."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.kubesim_support import Clock, advance, two_node_cluster
from tools.kubesim.cluster import Cluster, SimOptions
from tools.kubesim.operators.jobset import MAX_JOBS, MAX_PARALLELISM, job_key, plan_of

JS = "jobset.sigs.k8s.io/"


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cluster(clock: Clock) -> Cluster:
    return two_node_cluster(clock, SimOptions(run_delay=1.0, seed=7))


def rjob(
    name: str,
    replicas: int = 1,
    parallelism: int = 1,
    run_seconds: str = "",
    scheduler: str = "default-scheduler",
    backoff_limit: int | None = None,
) -> dict[str, Any]:
    annotations = {"kairos.io/run-seconds": run_seconds} if run_seconds else {}
    job_spec: dict[str, Any] = {
        "parallelism": parallelism,
        "completions": parallelism,
        "template": {
            "metadata": {"labels": {"app": name}, "annotations": annotations},
            "spec": {
                "schedulerName": scheduler,
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": "busybox"}],
            },
        },
    }
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    return {
        "name": name,
        "replicas": replicas,
        "template": {
            "metadata": {"labels": {"tier": name}, "annotations": {"note": "kept"}},
            "spec": job_spec,
        },
    }


def create(cluster: Cluster, spec: dict[str, Any], name: str = "js") -> Any:
    body = {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": {"name": name, "labels": {"kai.scheduler/queue": "research"}},
        "spec": spec,
    }
    obj = cluster.create(cluster.lookup("jobset.x-k8s.io", "v1alpha2", "jobsets"), "default", body)
    cluster.settle()
    return obj


def jobs(cluster: Cluster) -> dict[str, dict[str, Any]]:
    return {j["metadata"]["name"]: j for j in cluster.objects("batch/jobs", "default")}


def pods(cluster: Cluster) -> list[dict[str, Any]]:
    return cluster.objects("pods", "default")


def jobset(cluster: Cluster, name: str = "js") -> Any:
    return cluster.find("jobset.x-k8s.io/jobsets", "default", name)


def conditions(obj: Any) -> dict[str, str]:
    return {c["type"]: c["status"] for c in (obj.get("status") or {}).get("conditions") or ()}


def warnings(cluster: Cluster) -> list[str]:
    return [e["message"] for e in cluster.objects("events", "default") if e.get("type") == "Warning"]


def test_the_jobset_crd_is_served_from_the_start(cluster: Cluster) -> None:
    crds = {c["metadata"]["name"] for c in cluster.objects("apiextensions.k8s.io/customresourcedefinitions")}
    assert "jobsets.jobset.x-k8s.io" in crds
    rt = cluster.lookup("jobset.x-k8s.io", "v1alpha2", "jobsets")
    assert rt.namespaced
    assert rt.has_status


def test_each_replicated_job_gets_its_replicas_as_jobs_labelled_and_owned_as_jobset_does(
    cluster: Cluster,
) -> None:
    created = create(
        cluster, {"replicatedJobs": [rjob("driver"), rjob("workers", replicas=2, parallelism=2)]}
    )
    uid = created["metadata"]["uid"]
    by_name = jobs(cluster)
    assert set(by_name) == {"js-driver-0", "js-workers-0", "js-workers-1"}
    worker = by_name["js-workers-1"]
    marks = {
        JS + "jobset-name": "js",
        JS + "jobset-uid": uid,
        JS + "replicatedjob-name": "workers",
        JS + "replicatedjob-replicas": "2",
        JS + "global-replicas": "3",
        JS + "job-index": "1",
        JS + "job-global-index": "2",
        JS + "job-key": job_key("default", "js-workers-1"),
        JS + "restart-attempt": "0",
    }
    assert worker["metadata"]["labels"] == {"tier": "workers", **marks}
    assert worker["metadata"]["annotations"] == {"note": "kept", **marks}
    assert worker["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "name": "js",
            "uid": uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    template = worker["spec"]["template"]
    assert template["metadata"]["labels"].items() >= {"app": "workers", **marks}.items()
    assert template["spec"]["subdomain"] == "js"
    assert len(job_key("default", "js-workers-1")) == 40


def test_the_job_controller_gives_every_pod_the_template_labels_the_grouper_reads(cluster: Cluster) -> None:
    create(cluster, {"replicatedJobs": [rjob("driver"), rjob("workers", replicas=2, parallelism=2)]})
    made = pods(cluster)
    assert len(made) == 1 + 2 * 2
    for pod in made:
        labels = pod["metadata"]["labels"]
        assert labels[JS + "jobset-name"] == "js"
        assert labels["app"] == labels[JS + "replicatedjob-name"]
        assert pod["metadata"]["name"].startswith(
            f"js-{labels[JS + 'replicatedjob-name']}-{labels[JS + 'job-index']}-"
        )
        assert pod["metadata"]["ownerReferences"][0]["kind"] == "Job"
        assert pod["spec"]["schedulerName"] == "default-scheduler"
    workers = sorted(
        p["metadata"]["labels"][JS + "job-index"] for p in made if p["metadata"]["labels"]["app"] == "workers"
    )
    assert workers == ["0", "0", "1", "1"]


def test_a_jobset_runs_to_completed_when_all_its_jobs_complete(cluster: Cluster, clock: Clock) -> None:
    create(
        cluster,
        {"replicatedJobs": [rjob("driver", run_seconds="5"), rjob("workers", replicas=2, run_seconds="8")]},
    )
    advance(cluster, clock, 2)
    status = jobset(cluster)["status"]
    assert "terminalState" not in status
    assert {r["name"]: r["ready"] for r in status["replicatedJobsStatus"]} == {"driver": 1, "workers": 2}
    advance(cluster, clock, 5)
    status = jobset(cluster)["status"]
    assert {r["name"]: (r["succeeded"], r["ready"]) for r in status["replicatedJobsStatus"]} == {
        "driver": (1, 0),
        "workers": (0, 2),
    }
    advance(cluster, clock, 5)
    done = jobset(cluster)
    assert done["status"]["terminalState"] == "Completed"
    assert conditions(done) == {"Completed": "True"}
    assert done["status"]["conditions"][0]["reason"] == "AllJobsCompleted"


def test_success_policy_any_of_a_target_completes_the_jobset_and_removes_unfinished_jobs(
    cluster: Cluster, clock: Clock
) -> None:
    create(
        cluster,
        {
            "successPolicy": {"operator": "Any", "targetReplicatedJobs": ["driver"]},
            "replicatedJobs": [rjob("driver", run_seconds="3"), rjob("workers", replicas=2)],
        },
    )
    advance(cluster, clock, 6)
    assert jobset(cluster)["status"]["terminalState"] == "Completed"
    assert set(jobs(cluster)) == {"js-driver-0"}


def test_in_order_creates_a_replicated_job_once_the_one_before_is_ready(
    cluster: Cluster, clock: Clock
) -> None:
    create(
        cluster,
        {
            "startupPolicy": {"startupPolicyOrder": "InOrder"},
            "replicatedJobs": [rjob("driver"), rjob("workers", replicas=2, parallelism=2)],
        },
    )
    assert set(jobs(cluster)) == {"js-driver-0"}
    assert conditions(jobset(cluster)) == {"StartupPolicyInProgress": "True"}
    advance(cluster, clock, 2)
    assert set(jobs(cluster)) == {"js-driver-0", "js-workers-0", "js-workers-1"}
    advance(cluster, clock, 2)
    assert conditions(jobset(cluster)) == {
        "StartupPolicyInProgress": "False",
        "StartupPolicyCompleted": "True",
    }


def test_any_order_creates_every_job_at_once_even_before_any_pod_runs(cluster: Cluster) -> None:
    create(
        cluster,
        {
            "startupPolicy": {"startupPolicyOrder": "AnyOrder"},
            "replicatedJobs": [rjob("driver", scheduler="kai-scheduler"), rjob("workers", replicas=2)],
        },
    )
    assert set(jobs(cluster)) == {"js-driver-0", "js-workers-0", "js-workers-1"}
    assert "StartupPolicyInProgress" not in conditions(jobset(cluster))


def fail_a_pod(cluster: Cluster) -> None:
    pod = next(p for p in pods(cluster) if p["metadata"]["labels"].get("app") == "workers")
    cluster.store.put("pods", {**pod, "status": {**pod["status"], "phase": "Failed"}})
    cluster.settle()


def test_a_failed_job_fails_the_jobset(cluster: Cluster, clock: Clock) -> None:
    create(cluster, {"replicatedJobs": [rjob("driver"), rjob("workers", backoff_limit=0)]})
    advance(cluster, clock, 2)
    fail_a_pod(cluster)
    failed = jobset(cluster)
    assert failed["status"]["terminalState"] == "Failed"
    assert conditions(failed) == {"Failed": "True"}
    assert failed["status"]["conditions"][0]["reason"] == "FailedJobs"
    assert set(jobs(cluster)) == {"js-workers-0"}


def test_a_failed_job_restarts_the_jobset_until_max_restarts(cluster: Cluster, clock: Clock) -> None:
    create(
        cluster,
        {
            "failurePolicy": {"maxRestarts": 1},
            "replicatedJobs": [rjob("driver"), rjob("workers", backoff_limit=0)],
        },
    )
    advance(cluster, clock, 2)
    first = {n: j["metadata"]["uid"] for n, j in jobs(cluster).items()}
    fail_a_pod(cluster)
    again = jobs(cluster)
    assert set(again) == set(first)
    assert all(again[n]["metadata"]["uid"] != uid for n, uid in first.items())
    assert {j["metadata"]["labels"][JS + "restart-attempt"] for j in again.values()} == {"1"}
    assert jobset(cluster)["status"]["restarts"] == 1
    assert "terminalState" not in jobset(cluster)["status"]
    advance(cluster, clock, 2)
    fail_a_pod(cluster)
    failed = jobset(cluster)
    assert failed["status"]["terminalState"] == "Failed"
    assert failed["status"]["conditions"][0]["reason"] == "ReachedMaxRestarts"


def test_a_suspended_jobset_creates_its_jobs_suspended(cluster: Cluster) -> None:
    create(cluster, {"suspend": True, "replicatedJobs": [rjob("workers", replicas=2)]})
    assert all(j["spec"]["suspend"] is True for j in jobs(cluster).values())
    assert pods(cluster) == []
    assert jobset(cluster)["status"]["replicatedJobsStatus"][0]["suspended"] == 2


def test_deleting_the_jobset_deletes_its_jobs_and_pods(cluster: Cluster) -> None:
    create(cluster, {"replicatedJobs": [rjob("workers", replicas=2)]})
    assert len(pods(cluster)) == 2
    cluster.delete(cluster.lookup("jobset.x-k8s.io", "v1alpha2", "jobsets"), "default", "js", None)
    cluster.settle()
    assert jobs(cluster) == {}
    assert pods(cluster) == []


MALFORMED = [
    pytest.param({}, "spec.replicatedJobs", id="no replicated jobs"),
    pytest.param({"replicatedJobs": "two"}, "spec.replicatedJobs", id="replicated jobs not a list"),
    pytest.param({"replicatedJobs": [5]}, "spec.replicatedJobs[0]", id="a replicated job not an object"),
    pytest.param({"replicatedJobs": [{"replicas": 1}]}, "spec.replicatedJobs[0].name", id="unnamed"),
    pytest.param({"replicatedJobs": [rjob("a"), rjob("a")]}, "spec.replicatedJobs[1].name", id="named twice"),
    pytest.param(
        {"replicatedJobs": [{**rjob("a"), "replicas": -1}]}, "spec.replicatedJobs[0].replicas", id="negative"
    ),
    pytest.param(
        {"replicatedJobs": [{**rjob("a"), "replicas": "2"}]}, "spec.replicatedJobs[0].replicas", id="text"
    ),
    pytest.param(
        {"replicatedJobs": [{**rjob("a"), "replicas": 2.5}]}, "spec.replicatedJobs[0].replicas", id="float"
    ),
    pytest.param(
        {"replicatedJobs": [{**rjob("a"), "replicas": True}]}, "spec.replicatedJobs[0].replicas", id="bool"
    ),
    pytest.param(
        {"replicatedJobs": [{"name": "a", "template": {"spec": {"parallelism": "4", "template": {}}}}]},
        "spec.replicatedJobs[0].template.spec.parallelism",
        id="parallelism as text",
    ),
    pytest.param(
        {"replicatedJobs": [{"name": "a", "template": {"spec": {"completions": -1}}}]},
        "spec.replicatedJobs[0].template.spec.completions",
        id="negative completions",
    ),
    pytest.param(
        {"replicatedJobs": [{"name": "a", "template": "job"}]},
        "spec.replicatedJobs[0].template",
        id="a template not an object",
    ),
    pytest.param(
        {
            "replicatedJobs": [
                {"name": "a", "template": {"spec": {"template": {"metadata": {"labels": {"x": 1}}}}}}
            ]
        },
        "spec.replicatedJobs[0].template.spec.template.metadata.labels[x]",
        id="a pod label not text",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")], "startupPolicy": {"startupPolicyOrder": "Sideways"}},
        "spec.startupPolicy.startupPolicyOrder",
        id="an unknown startup order",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")], "successPolicy": {"operator": "Most"}},
        "spec.successPolicy.operator",
        id="an unknown success operator",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")], "successPolicy": {"operator": "Any", "targetReplicatedJobs": ["b"]}},
        "spec.successPolicy.targetReplicatedJobs",
        id="a success target that is no replicated job",
    ),
    pytest.param(
        {"replicatedJobs": [rjob("a")], "failurePolicy": {"maxRestarts": "9" * 5000}},
        "spec.failurePolicy.maxRestarts",
        id="max restarts of 5,000 digits",
    ),
]


@pytest.mark.parametrize(("spec", "field"), MALFORMED)
def test_a_malformed_jobset_creates_nothing_and_says_why_in_a_warning(
    cluster: Cluster, spec: dict[str, Any], field: str
) -> None:
    create(cluster, spec)
    assert jobs(cluster) == {}
    assert pods(cluster) == []
    [message] = warnings(cluster)
    assert message.startswith(f"{field}: ")
    assert len(message) < 300


def test_hostile_counts_are_cut_to_the_simulators_bounds() -> None:
    js = {
        "metadata": {"name": "js"},
        "spec": {
            "replicatedJobs": [{**rjob("a", parallelism=10**9), "replicas": 10**9}, rjob("b", replicas=5)]
        },
    }
    plan = plan_of(js)
    assert [(rj.replicas, rj.pods_per_job) for rj in plan.jobs] == [(MAX_JOBS, MAX_PARALLELISM), (0, 1)]
