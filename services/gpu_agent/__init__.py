"""The GPU node agent: reads each node's GPUs through NVML and publishes the inventory on NATS.

`nvml` reads the devices (the one place NVML's errors are translated), `service` is the shell that
`python -m services.gpu_agent` runs; the wire contract is `shared.contracts.inventory`.
"""
