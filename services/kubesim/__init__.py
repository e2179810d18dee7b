"""The simulated Kubernetes API server (with a KWOK-like node simulator and minimal workload controllers):
the default cluster of `kairos up` and of the integration and end-to-end tests."""
