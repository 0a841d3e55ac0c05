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
