"""The nats-server configuration text for Kairos's identities (`authorization`) and for TLS (`tls`).

Pure text builders: `tools.stack.nats_server` writes them for the local stack (`kairos up`, with literal
per-stack passwords), and deploy/base/nats-auth.conf is their output for Kubernetes (passwords as
environment references that the StatefulSet fills from a Secret; `python -m shared.security.nats_config`
prints it, and a test keeps the file equal to it).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from shared.security.permissions import IDENTITIES, permissions

_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]*$")


@dataclass(frozen=True)
class EnvRef:
    """A password the server reads from its environment (`$NAME` in the configuration)."""

    name: str

    def __post_init__(self) -> None:
        if not _ENV_NAME.match(self.name):
            raise ValueError(f"environment variable name {self.name!r}: expected [A-Z_][A-Z0-9_]*")


def password_env(identity: str) -> str:
    """The variable that holds an identity's password in the NATS pods (deploy/base)."""
    return f"KAIROS_NATS_PASSWORD_{identity.upper()}"


def quote(text: str) -> str:
    """A quoted string in NATS's configuration syntax."""
    # JSON string syntax is NATS's quoted-string syntax; quoting also keeps `$JS...` from being read as a
    # variable reference.
    return json.dumps(text)


def _allow(kind: str, items: tuple[str, ...]) -> list[str]:
    return [
        f"        {kind}: {{",
        "          allow: [",
        *(f"            {quote(i)}" for i in items),
        "          ]",
        "        }",
    ]


def authorization(passwords: Mapping[str, str | EnvRef]) -> str:
    """An `authorization` block with one user per identity in `passwords` (identity -> password, or the
    environment variable holding it), each with its permissions."""
    lines = ["authorization {", "  users: ["]
    for identity, secret in passwords.items():
        p = permissions(identity)
        password = f"${secret.name}" if isinstance(secret, EnvRef) else quote(secret)
        lines += [
            "    {",
            f"      user: {quote(identity)}",
            f"      password: {password}",
            "      permissions: {",
            *_allow("publish", p.publish),
            *_allow("subscribe", p.subscribe),
        ]
        if p.allow_responses:
            lines.append("        allow_responses: true")
        lines += ["      }", "    }"]
    lines += ["  ]", "}"]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: the server's certificate and key, and the CA that signed it (clients verify with it)."""

    cert: str
    key: str
    ca: str
    verify_clients: bool = False
    """Require client certificates signed by `ca` (mutual TLS) on top of the passwords."""


def tls(files: TlsFiles) -> str:
    """A `tls` block: the server then accepts TLS connections only."""
    lines = [
        "tls {",
        f"  cert_file: {quote(files.cert)}",
        f"  key_file: {quote(files.key)}",
        f"  ca_file: {quote(files.ca)}",
        "  timeout: 5",
    ]
    if files.verify_clients:
        lines.append("  verify: true")
    lines.append("}")
    return "\n".join(lines) + "\n"


DEPLOY_HEADER = """\
# Kairos's NATS identities and their subject permissions (included by nats.conf). Generated: do not edit;
# `python -m shared.security.nats_config > deploy/base/nats-auth.conf` rewrites it from
# shared/security/permissions.py (a test checks they agree). The passwords come from the Secret
# kairos-nats-auth through the StatefulSet's environment; see docs/security.md.
"""


def deploy_authorization() -> str:
    """deploy/base/nats-auth.conf: every identity but the local stack's `admin`, passwords from env."""
    return DEPLOY_HEADER + authorization({i: EnvRef(password_env(i)) for i in IDENTITIES})


if __name__ == "__main__":
    sys.stdout.write(deploy_authorization())
