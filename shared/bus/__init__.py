"""The NATS shell every service shares: server process, connection, KV with compare-and-set, leases,
the state replica, message middleware and the service runner. Only this package imports `nats`."""
