"""SafeCache: transformer KV caches keyed by LSH of embeddings, reused only for near-identical prompts.

In-process: :class:`SafeCache`. Over HTTP: ``mmlake cache serve`` and :class:`SafeCacheClient`.
Importing this package loads no model and starts nothing.
"""

from __future__ import annotations

from mmlake.cache.client import SafeCacheClient
from mmlake.cache.core import Hit, Miss, PutResult, SafeCache
from mmlake.cache.errors import (
    BadRequestError,
    BusyError,
    CacheError,
    ForbiddenError,
    PayloadTooLargeError,
    QuotaExceededError,
    RequestTimeoutError,
    UnauthorizedError,
)
from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.settings import CacheSettings
from mmlake.cache.snapshot import load_snapshot, save_snapshot

__all__ = [
    "BadRequestError",
    "BusyError",
    "CacheError",
    "CacheSettings",
    "ForbiddenError",
    "Hit",
    "HyperplaneLSH",
    "Miss",
    "PayloadTooLargeError",
    "PutResult",
    "QuotaExceededError",
    "RequestTimeoutError",
    "SafeCache",
    "SafeCacheClient",
    "UnauthorizedError",
    "load_snapshot",
    "save_snapshot",
]
