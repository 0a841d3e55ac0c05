"""SafeCache: transformer KV caches keyed by LSH of embeddings, reused only for near-identical prompts.

In-process: :class:`SafeCache`. Over HTTP: ``mmlake cache serve`` and :class:`SafeCacheClient`.
Importing this package loads no model and starts nothing.
"""

from __future__ import annotations

from cache.client import SafeCacheClient
from cache.core import Hit, Miss, PutResult, SafeCache
from cache.errors import BadRequestError, CacheError, PayloadTooLargeError, UnauthorizedError
from cache.lsh import HyperplaneLSH
from cache.settings import CacheSettings
from cache.snapshot import load_snapshot, save_snapshot

__all__ = [
    "BadRequestError",
    "CacheError",
    "CacheSettings",
    "Hit",
    "HyperplaneLSH",
    "Miss",
    "PayloadTooLargeError",
    "PutResult",
    "SafeCache",
    "SafeCacheClient",
    "UnauthorizedError",
    "load_snapshot",
    "save_snapshot",
]
