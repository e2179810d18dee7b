"""The NATS shell every service shares: connection, KV with compare-and-set, leases, the state replica,
message middleware, the service runner and readiness from heartbeats. Only this package imports `nats`.

(The local nats-server process the stack and the tests start is `tools.stack.nats_server`.)"""
