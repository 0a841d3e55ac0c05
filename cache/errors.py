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
