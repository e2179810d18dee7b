"""API errors of the simulated API server, each rendered as a metav1 Status object.

Raised by the pure parts (`store`, `cluster`, `selectors`, `patch`, `controllers`) wherever the real API
server would answer an error; the aiohttp shell (`tools.kubesim.server`) turns an `ApiError` into its
Status response. The helpers word the messages as the real server does (`pods "x" not found`), because
clients and people match on them.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ApiError",
    "already_exists",
    "bad_request",
    "conflict",
    "forbidden",
    "gone",
    "invalid",
    "not_found",
    "status_success",
    "too_many_requests",
]

Obj = dict[str, Any]


class ApiError(Exception):
    """An error answer: HTTP `code`, Status `reason`, `message`, and the object it is about."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str = "",
        group: str = "",
        kind: str = "",
        causes: list[Obj] | None = None,
        retry_after: int = 0,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after = retry_after
        """Seconds a client should wait before asking again (details.retryAfterSeconds and the
        Retry-After header); 0: none said."""

    def status(self) -> Obj:
        """The metav1 Status object the server answers with."""
        out: Obj = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if not self.reason:  # a Status the registry answers itself (two budgets' 500) names none
            del out["reason"]
        details: Obj = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = self.causes
        if self.retry_after:
            details["retryAfterSeconds"] = self.retry_after
        if details:
            out["details"] = details
        return out


def status_success(code: int = 200, *, name: str = "", kind: str = "", group: str = "") -> Obj:
    out: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}
    details = {k: v for k, v in (("name", name), ("group", group), ("kind", kind)) if v}
    if details:
        out["details"] = details
    return out


def _qualified(plural: str, group: str) -> str:
    return f"{plural}.{group}" if group else plural


def not_found(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{_qualified(plural, group)} "{name}" not found',
        name=name,
        group=group,
        kind=plural,
    )


def already_exists(plural: str, name: str, group: str = "") -> ApiError:
    return ApiError(
        409,
        "AlreadyExists",
        f'{_qualified(plural, group)} "{name}" already exists',
        name=name,
        group=group,
        kind=plural,
    )


def conflict(plural: str, name: str, problem: str, group: str = "") -> ApiError:
    return ApiError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {_qualified(plural, group)} "{name}": {problem}',
        name=name,
        group=group,
        kind=plural,
    )


def invalid(
    kind: str, name: str, field: str, problem: str, *, group: str = "", value: Any = None
) -> ApiError:
    """422 Invalid for `field` of the `kind` object `name` (`problem` reads like the real server's)."""
    detail = f"{field}: {problem}" if field else problem
    if value is not None:
        detail = f"{field}: Invalid value: {value!r}: {problem}"
    return ApiError(
        422,
        "Invalid",
        f'{kind} "{name}" is invalid: {detail}',
        name=name,
        group=group,
        kind=kind,
        causes=[{"reason": "FieldValueInvalid", "message": problem, "field": field}],
    )


def bad_request(message: str) -> ApiError:
    return ApiError(400, "BadRequest", message)


def forbidden(plural: str, name: str, problem: str, group: str = "") -> ApiError:
    return ApiError(
        403,
        "Forbidden",
        f'{_qualified(plural, group)} "{name}" is forbidden: {problem}',
        name=name,
        group=group,
        kind=plural,
    )


def gone(message: str) -> ApiError:
    return ApiError(410, "Expired", message)


def too_many_requests(message: str, causes: list[Obj], retry_after: int = 0) -> ApiError:
    """429 TooManyRequests as the registry words it (`errors.NewTooManyRequests`), with its causes."""
    return ApiError(429, "TooManyRequests", message, causes=causes, retry_after=retry_after)
