"""The GPU node agent: reads each node's GPUs through NVML and publishes the inventory on NATS."""
