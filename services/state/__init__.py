"""The state service, built in issue 3: it will own the cluster snapshot (nodes, queues, pod groups, pods),
apply the changes it receives, and publish consistent snapshots over NATS for the other services. Nothing
is implemented here yet.
"""
