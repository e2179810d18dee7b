"""Kubernetes objects as Kairos reads and writes them, translated to and from the model; pure, no I/O.

The I/O side (kubernetes-asyncio clients, informers, API calls) is `shared.kubeapi`.
"""
