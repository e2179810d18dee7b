"""The local stack: what `kairos up`, the conformance runner's `--via-bus` mode, the benchmarks, the chaos
suite and the end-to-end tests run Kairos on.

`supervisor` starts nats-server, the cluster (the simulated API server `tools.kubesim`, a real cluster's
kubeconfig, or the state service's in-memory cluster) and the four services as processes, waits until
every replica is ready, and stops them together; `nats_server` starts and stops a local nats-server with
JetStream (also the tests' fixture); `bootstrap` creates the objects a fresh cluster needs (KAI's default
queues); `pod_watch` watches the pods of one namespace (each one's name and node), which the benchmarks and
the chaos suite time binds by.
"""
