"""The binder service: commits placement proposals and carries them out in the cluster.

Each replica pulls `Proposal`s for its shard from the `KAIROS_PROPOSALS` stream (shared durable consumer:
one binder per proposal), checks the proposal's lease term, claims its pods and reserves them on their
nodes in the `kairos_ledger` KV by compare-and-set (the whole proposal or nothing), then asks the cluster
(through a `ClusterClient`: the Kubernetes API, or the state service's in-memory cluster over NATS) to
evict and bind, and reports an `Outcome` to the queue leader and public events to users. A recovery scan
binds pods whose ledger commit completed but whose bind was lost to a crash. Modules: `commit` (the
protocol), `cluster_client` (the in-memory cluster), `kube_client` (Kubernetes), `reservations` and
`sharing` (GPU sharing's reservation pods and ConfigMaps), `service` (the NATS shell), `__main__` (the
entry point).
"""
