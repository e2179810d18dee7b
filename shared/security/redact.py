"""Credentials out of what we print: `nats://user:secret@host` becomes `nats://user:***@host`.

Called wherever a NATS URL reaches a log line or an error message (`shared.bus.connection`,
`shared.bus.client`, the local stack's records), because the local stack's URLs carry a password.
"""

from __future__ import annotations

import re

_USERINFO = re.compile(
    r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)(?P<user>[^:@/\s,]*)(?P<password>:[^@/\s,]*)?@"
)


def redact_url(text: str) -> str:
    """Every URL's password (and a bare token such as `nats://token@host`) replaced by `***`; the user
    name stays, so a log still says who connected. Text without credentials comes back unchanged."""

    def hide(m: re.Match[str]) -> str:
        if m.group("password") is None:
            return f"{m.group('scheme')}***@"
        return f"{m.group('scheme')}{m.group('user')}:***@"

    return _USERINFO.sub(hide, text)
