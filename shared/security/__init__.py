"""NATS identities, their subject permissions and the server's authorization text (pure), and the
redaction of credentials in URLs. See docs/security.md."""
