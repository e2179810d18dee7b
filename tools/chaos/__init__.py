"""The chaos suite (`kairos chaos`, `make chaos`): a scheduling load on the whole stack while replicas are
killed, nats-server restarts and the simulated API server injects faults (`runner`), then an independent
verdict on what the API server and JetStream show (`checker`)."""
