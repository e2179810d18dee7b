"""Talking to a Kubernetes API server through kubernetes-asyncio: client set-up, informers, calls.

The only package besides the services that imports kubernetes_asyncio; what it reads is translated by the
pure `shared.kube`.
"""
