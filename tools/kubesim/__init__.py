"""The simulated Kubernetes API server (with a KWOK-like node simulator and minimal workload controllers):
the default cluster of `kairos up` and of the integration and end-to-end tests.

Run it as a process (``python -m tools.kubesim [--host H] [--port P] [--cluster FILE | --nodes N
--gpus-per-node G] [--crds DIR]... [--kubeconfig-out FILE] [--kubeconfig-server URL] [--run-delay S]
[--watch-history N] [--bookmark-seconds S] [--no-default-scheduler] [--seed N] [--faults FILE]``; it prints
``kubesim ready <url>`` once serving and exits 0 on SIGTERM/SIGINT) or in-process
(`tools.kubesim.server.KubeSim`: ``await sim.start()`` returns the URL, ``sim.cluster`` is the store
for assertions, ``await sim.stop()``).

**What is simulated.** The REST API that kubectl 1.32 and kubernetes-asyncio use, over plain HTTP without
authentication, JSON only:

- kubectl's typed ``create <kind>`` generators, which send protobuf (`protobuf` decodes those kinds);
- discovery (``/version``, ``/api``, ``/apis``, per group/version lists, aggregated discovery v2) and
  schema-less OpenAPI v3 documents, enough for ``kubectl apply``/``create`` with validation on (the server
  is announced as validating fields; it does not actually reject unknown fields);
- namespaces (default, kube-system, kube-public, kube-node-lease, kai-scheduler at start, each with a
  ``default`` ServiceAccount; deleting one deletes its objects), nodes, pods (with the ``binding``,
  ``eviction``, ``status`` subresources; ``log`` answers 400), events (core/v1 and events.k8s.io/v1, one
  store), configmaps, secrets, serviceaccounts, services (stored only), priorityclasses (KAI's train 50,
  build-preemptible 75, build 100, inference 125 and the two system classes exist at start), leases,
  jobs, deployments, replicasets, statefulsets (with ``scale``), daemonsets (stored only) and
  customresourcedefinitions: a CRD's served versions are served at once (scope, status subresource,
  short names, categories, printer columns); deleting it deletes its objects;
- get, list, watch, create, update, patch (JSON merge, JSON patch, an approximation of strategic merge,
  server-side apply as strategic merge without field ownership), delete and deletecollection; uid,
  one global resourceVersion, generation, creationTimestamp, generateName; 409 Conflict for a stale
  resourceVersion, 409 AlreadyExists, 422 Invalid for obviously invalid objects, 404 NotFound, all as
  metav1 Status objects; defaults and status resets on create as the real registry does (pod status
  Pending, requests defaulted from limits, a pod's priority from its PriorityClass: an unknown class is
  403 Forbidden);
- label and field selectors, limit/continue pagination (in key order, over the current state), watches
  from a resourceVersion within a bounded window per resource (older: an ERROR event with a 410 Expired
  Status), bookmarks, ``sendInitialEvents``, ``timeoutSeconds``;
- meta.k8s.io/v1 Tables for ``kubectl get`` (the usual columns per kind; custom resources show their
  printer columns);
- garbage collection through ownerReferences (Background and Foreground delete dependents, Orphan
  releases them), finalizers delay deletion until they are removed;
- the node simulator (`nodesim`): nodes from a cluster file or generated, with GPU and MIG resources and
  GPU feature discovery labels; a bound pod runs ``--run-delay`` seconds later (podIP, hostIP,
  container statuses), and succeeds after ``kairos.io/run-seconds`` (label or annotation) when set;
  graceful termination for a pod with ``kairos.io/stop-seconds: N`` (its containers take N s to exit after
  SIGTERM): deleted on its node with a grace period, it stays Running with ``deletionTimestamp`` set, holding
  its devices, until min(N, grace), then turns Succeeded (or Failed, killed at the grace's end) and its
  kubelet deletes it; an image from a registry host ending in ``.invalid`` cannot be pulled (the container
  waits ``ErrImagePull``, then ``ImagePullBackOff``; the pod stays Pending with the devices it was
  admitted with);
- the kubelet's device plugin and container start (`kubelet`, `devices`, `containerenv`): a node with
  ``nvidia.com/gpu: N`` has N devices with fixed UUIDs (``GPU-`` + uuid5 of node name and index); a
  starting container asking for ``nvidia.com/gpu`` (limits, else requests) gets that many devices of its
  node, lowest free index first (init containers' devices reused), held until the pod is deleted or
  terminates; too few free devices fail the pod as the kubelet does (Failed, ``UnexpectedAdmissionError``,
  ``Pod was rejected: Allocate failed due to requested number of devices unavailable for nvidia.com/gpu.
  Requested: 1, Available: 0, which is unexpected``), so a scheduler's over-commitment shows. Variables
  from ConfigMaps (``env[].valueFrom.configMapKeyRef``, ``envFrom[].configMapRef``) are resolved at start:
  a missing required ConfigMap or key keeps the pod Pending, the container waiting with
  ``CreateContainerConfigError`` and the kubelet's message, tried again when a ConfigMap of the namespace
  changes and every 10 s. The container ``resource-reservation`` of a pod in ``kai-resource-reservation``
  runs the reservation program over a fake NVML holding its devices and annotates its pod
  (``run.ai/reserve_for_gpu_index: <UUID>``, a MODIFIED event). ``GET /kubesim/v1/nodes/{node}/devices``
  answers ``{"node", "devices": [UUIDs in index order], "containers": [{"namespace", "pod", "container",
  "init", "devices": [UUIDs], "visible": NVIDIA_VISIBLE_DEVICES or null}]}`` for the containers of the
  node's running pods (404 for an unknown node); ``visible`` is the device plugin's value for a container
  with devices, else the pod spec's (literal or ConfigMap);
- operators of workload CRDs (`operators`, a module each): their CRDs exist at start and a simulated
  operator creates what the real one does, with the statuses `kubectl get` shows and a Warning Event for
  a spec the real one refuses: Kubeflow training jobs (`operators.training`: PyTorchJob, TFJob,
  XGBoostJob, JAXJob, MPIJob; each replica's pods ``<job>-<replica type>-<i>`` with the
  ``training.kubeflow.org/*`` labels, an MPIJob's launcher as a batch Job), Kubeflow Notebooks
  (`operators.notebook`: a StatefulSet of one pod), KubeRay (`operators.ray`: a RayCluster's head and
  worker pods, a RayJob's cluster and submitter Job, a RayService's cluster), JobSet (`operators.jobset`:
  a batch Job per replica of each replicated job, InOrder or AnyOrder), LeaderWorkerSet
  (`operators.leaderworkerset`: the leaders' StatefulSet and each group's workers' StatefulSet owned by
  its leader pod) and Knative Serving (`operators.knative`: Service, Configuration, Revision, and a
  Deployment per Revision of its min-scale);
- controllers (`controllers`): Job, Deployment → ReplicaSet → pods, StatefulSet; a first-fit default
  scheduler (`scheduler`) binds pods of ``default-scheduler``; pods of any other scheduler are bound only
  through pods/binding (Kairos's binder); storage (`storage`, `default_storage_class`,
  `ephemeral_volumes`) and DRA (`dra`) controllers; `assembly.build_cluster` builds the cluster and then
  its controllers (neither module imports the other), `writes` holds what both exchange;
- admission webhooks (`admission`, `webhooks`): Mutating/ValidatingWebhookConfigurations
  (admissionregistration.k8s.io/v1) are called on create, update (subresources included) and delete, as
  the real server calls them (rules, namespace and object selectors, failurePolicy, timeoutSeconds, JSON
  patches, denials; https verified against caBundle, plain http also accepted; a ``service`` client config
  is unreachable); scheduling gates hold a pod (SchedulingGated; binding it is refused);
- PodDisruptionBudgets (policy/v1) on the Eviction endpoint (`disruption`): minAvailable or
  maxUnavailable, a number or a percentage of the pods' controllers' scale, over the Ready pods of the
  budget's namespace its selector matches; an eviction that would leave too few is 429 TooManyRequests
  with a ``DisruptionBudget`` cause naming the budget, a pod two budgets select is a 500, and a pod that is
  not running goes regardless; the uid (and resourceVersion) preconditions of a binding's metadata and of
  an eviction's deleteOptions answer 409 Conflict, worded as the real server words them.

**Fault injection** (`faults`, for the chaos suite): a plan of rules makes a fraction of the requests of a
verb and resource answer 5xx or 429 (with Retry-After), answer late, or answer a watch resume 410 Gone;
``POST /kubesim/faults/drop-watches`` closes the open watches. ``/kubesim/faults`` reads and replaces the
plan at run time, ``/kubesim/bindings`` lists every accepted (and refused) pods/binding call per pod.

**What is not.** Authentication and authorisation; protobuf beyond what kubectl's ``create <kind>``
generators send (namespace, configmap, secret, serviceaccount, priorityclass, deployment, job, cronjob,
service, poddisruptionbudget, quota, role(binding), clusterrole(binding)) and CBOR; webhooks on
deletecollection, CONNECT and the legacy ``bindings`` resource; the disruption controller (a budget's
status is never written: the eviction counts it on the spot, so a new budget is never "still being
processed" unless its pods' controller cannot be counted); resource quotas, CRD schema
validation, defaulting and pruning, conversion between a CRD's versions; graceful pod termination
for pods without ``kairos.io/stop-seconds`` (their deletion is immediate unless finalizers are set); a
dependent with several owners is deleted with the
first; container restarts, probes, logs, exec and port-forward; variables from secrets, the downward API
and resource fields, and ``$(VAR)`` expansion (not resolved); devices other than ``nvidia.com/gpu`` (MIG
instances are counted by the scheduler only) and device health; kube-proxy, services' cluster IPs and
endpoints; node heartbeats and leases; the queues, podgroups and pods of a cluster file (only its nodes
are simulated: submit the rest through the API); rolling updates (a Deployment replaces all pods at once)
and ordered StatefulSet start-up (all pods are created together).
"""
