"""Errors of SafeCache. Each maps to one HTTP status in the server."""

from __future__ import annotations

from mmlake.errors import MmlakeError


class CacheError(MmlakeError):
    """Base class of cache errors."""


class BadRequestError(CacheError, ValueError):
    """Malformed or unusable input (HTTP 400). Nothing in the cache changed."""


class PayloadTooLargeError(CacheError, ValueError):
    """A body or entry over the configured size limit (HTTP 413). Nothing in the cache changed."""


class UnauthorizedError(CacheError, PermissionError):
    """A missing or unknown bearer token (HTTP 401)."""


class QuotaExceededError(CacheError, ValueError):
    """A tenant's bound (models in the cache) is reached (HTTP 429). Nothing in the cache changed."""


class ForbiddenError(CacheError, PermissionError):
    """A valid token that may not use this route (HTTP 403): a tenant on an operator route, or the reverse."""


class BusyError(CacheError, RuntimeError):
    """The server holds as many request bytes as it may (HTTP 503, with Retry-After); try again."""


class RequestTimeoutError(CacheError, TimeoutError):
    """A request body that did not arrive in time (HTTP 408; the connection is closed)."""


#: The HTTP status of each error (anything else a ``CacheError`` is 400): the server answers with it,
#: the client raises the error again from it.
HTTP_STATUS: dict[type[CacheError], int] = {
    UnauthorizedError: 401,
    ForbiddenError: 403,
    RequestTimeoutError: 408,
    PayloadTooLargeError: 413,
    QuotaExceededError: 429,
    BusyError: 503,
}


def status_of(err: CacheError) -> int:
    """The HTTP status the server answers ``err`` with."""
    return next((code for kind, code in HTTP_STATUS.items() if isinstance(err, kind)), 400)


def error_for(status: int) -> type[CacheError]:
    """The error a client raises for an HTTP error status (a 5xx not in the table: ``CacheError``)."""
    by_status = {code: kind for kind, code in HTTP_STATUS.items()}
    return by_status.get(status, CacheError if status >= 500 else BadRequestError)
