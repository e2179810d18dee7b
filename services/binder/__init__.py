"""The binder service, built in issue 3: it will carry out the placement decisions it receives over NATS,
binding pods to nodes and evicting pods, and report the outcome back to the state service. Nothing is
implemented here yet.
"""
