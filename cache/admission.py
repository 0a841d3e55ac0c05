"""Admission: a bucket whose distinct entries are confusable (similar enough to answer for each other)
too often is not safe to add to. Each namespace keeps, per table-0 LSH bucket, how many pairs a store
compared with the bucket's members and how many of them were confusable."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mmlake.cache.entries import Namespace

#: The bucket members a store is compared with (the first ones: enough for a rate, bounded work).
COMPARED_MEMBERS = 64


@dataclass
class _BucketStats:
    pairs: int = 0
    confusable: int = 0


class Admission:
    """Per namespace and bucket, the confusable-pair rate; refuses a bucket whose rate passed the bound
    once at least ``min_pairs`` pairs were seen."""

    def __init__(self, bound: float, min_pairs: int, min_similarity: float) -> None:
        self.bound, self.min_pairs, self.min_similarity = bound, min_pairs, min_similarity
        self._stats: dict[Namespace, dict[int, _BucketStats]] = {}

    def refusal(self, namespace: Namespace, bucket: int, key: str) -> str | None:
        """Why a store into ``bucket`` (``key``: its hex form) is refused, or None when it may go in."""
        stats = self._stats.get(namespace, {}).get(bucket)
        if stats is None or stats.pairs < self.min_pairs:
            return None
        rate = stats.confusable / stats.pairs
        return f"bucket {key} collision rate {rate:.3f} exceeds {self.bound}" if rate > self.bound else None

    def record(self, namespace: Namespace, bucket: int, similarities: np.ndarray) -> None:
        """Count a store's similarities to the bucket's members."""
        stats = self._stats.setdefault(namespace, {}).setdefault(bucket, _BucketStats())
        stats.pairs += len(similarities)
        stats.confusable += int(np.sum(similarities >= self.min_similarity))

    def forget(self, namespace: Namespace) -> None:
        self._stats.pop(namespace, None)
