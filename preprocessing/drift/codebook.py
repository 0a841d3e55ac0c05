"""The codebook that turns embeddings into codes: spherical k-means, fitted once on the reference
window of a stream and pinned by the SHA-256 of its bytes.

An embedding is centred on the reference mean and L2-normalised before it is assigned to the centroid
of highest cosine; centring matters for encoders whose outputs share a large common direction
(untrained ones especially). Fitting is deterministic: k-means++ seeding from a fixed seed, a fixed
number of Lloyd iterations, float64 arithmetic, ties broken by the lowest index.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from mmlake.errors import InputError
from mmlake.preprocessing.errors import DriftStateError


def prepare(x: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """Centre on ``mean`` and L2-normalise each row (rows that vanish stay zero)."""
    y = np.asarray(x, dtype=np.float64) - mean
    norms = np.linalg.norm(y, axis=1, keepdims=True)
    return np.divide(y, norms, out=np.zeros_like(y), where=norms > 0)


@dataclass(frozen=True)
class Codebook:
    """Centroids (unit rows) over centred, normalised embeddings of one modality."""

    modality: str
    mean: np.ndarray  # (dim,) float32
    std: np.ndarray  # (dim,) float32, per-dimension spread of the reference
    whiten: np.ndarray  # (dim, dim) float32: inverse square root of the reference's shrunk covariance
    centroids: np.ndarray  # (codes, dim) float32
    seed: int
    fitted_on: int  # how many reference embeddings

    @property
    def codes(self) -> int:
        return int(self.centroids.shape[0])

    @property
    def dim(self) -> int:
        return int(self.centroids.shape[1])

    @property
    def sha256(self) -> str:
        """Digest of everything that decides a code: the header (JSON) and the float32 bytes."""
        header = json.dumps(
            {
                "modality": self.modality,
                "codes": self.codes,
                "dim": self.dim,
                "seed": self.seed,
                "fitted_on": self.fitted_on,
                "dtype": "<f4",
            },
            sort_keys=True,
        ).encode()
        h = hashlib.sha256(header)
        h.update(np.ascontiguousarray(self.mean, dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(self.std, dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(self.whiten, dtype="<f4").tobytes())
        h.update(np.ascontiguousarray(self.centroids, dtype="<f4").tobytes())
        return h.hexdigest()

    def assign(self, x: np.ndarray) -> np.ndarray:
        """The code (centroid index) of each row of ``x``; rows must be finite and non-zero."""
        if x.shape[1] != self.dim:
            raise InputError(
                f"{self.modality} embeddings have {x.shape[1]} dimensions, "
                f"the codebook {self.sha256[:12]} was fitted on {self.dim}"
            )
        y = prepare(x, self.mean.astype(np.float64))
        return np.argmax(y @ self.centroids.astype(np.float64).T, axis=1).astype(np.int64)

    @classmethod
    def fit(cls, modality: str, x: np.ndarray, codes: int, *, seed: int = 0, iterations: int = 30) -> Codebook:
        x = np.asarray(x, dtype=np.float64)
        if len(x) < codes:
            raise InputError(f"{modality}: {len(x)} reference embeddings cannot fit {codes} codes")
        mean = x.mean(axis=0).astype(np.float32)
        y = prepare(x, mean.astype(np.float64))
        rng = np.random.default_rng(seed)
        centroids = _kmeans_pp(y, codes, rng)
        for _ in range(iterations):
            labels = np.argmax(y @ centroids.T, axis=1)
            for k in range(codes):
                members = y[labels == k]
                if len(members) == 0:
                    # An empty cluster takes the point worst served by its centroid.
                    worst = int(np.argmin(np.max(y @ centroids.T, axis=1)))
                    centroids[k] = y[worst]
                    continue
                s = members.sum(axis=0)
                n = np.linalg.norm(s)
                centroids[k] = s / n if n > 0 else members[0]
        std = np.maximum(x.std(axis=0), 1e-6).astype(np.float32)
        return cls(modality, mean, std, _whitener(x, SHRINKAGE), centroids.astype(np.float32), seed, len(x))

    def mean_shift(self, x: np.ndarray) -> float:
        """How far the mean of ``x`` lies from the reference mean, in the reference's whitened space
        (Hotelling's T^2 with a shrunk covariance), as (T^2 - dim) / sqrt(2 dim): with a well-estimated
        covariance, a chi-square with ``dim`` degrees of freedom standardised (about 0 +- 1 whatever the
        size of ``x``); with a reference of few samples per dimension the shrinkage puts its level lower.
        Either way its level and spread under no drift are what the thresholds learn."""
        z = (np.asarray(x, dtype=np.float64).mean(axis=0) - self.mean) @ self.whiten.astype(np.float64)
        t2 = len(x) * float(z @ z)
        return (t2 - self.dim) / float(np.sqrt(2 * self.dim))

    # -- persistence (a row of the codebook table) -------------------------------------------------

    def to_row(self) -> dict[str, object]:
        return {
            "modality": self.modality,
            "codebook_sha256": self.sha256,
            "codes": self.codes,
            "dim": self.dim,
            "seed": self.seed,
            "fitted_on": self.fitted_on,
            "mean": self.mean.astype(np.float32).tolist(),
            "std": self.std.astype(np.float32).tolist(),
            "whiten": self.whiten.astype(np.float32).ravel().tolist(),
            "centroids": self.centroids.astype(np.float32).ravel().tolist(),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Codebook:
        dim, codes = int(row["dim"]), int(row["codes"])
        book = cls(
            str(row["modality"]),
            np.asarray(row["mean"], dtype=np.float32),
            np.asarray(row["std"], dtype=np.float32),
            np.asarray(row["whiten"], dtype=np.float32).reshape(dim, dim),
            np.asarray(row["centroids"], dtype=np.float32).reshape(codes, dim),
            int(row["seed"]),
            int(row["fitted_on"]),
        )
        if book.sha256 != row["codebook_sha256"]:
            raise DriftStateError(
                f"the {book.modality} codebook's bytes hash to {book.sha256[:16]}..., "
                f"its row says {str(row['codebook_sha256'])[:16]}...: refusing a changed codebook"
            )
        return book


#: Weight of the scaled identity in the shrunk covariance (the reference has few samples per dimension).
SHRINKAGE = 0.2


class LeaveOut:
    """The mean-shift statistic of some rows of the reference against *the rest* of it: the rest's own
    mean and shrunk covariance, exactly what :meth:`Codebook.fit` on the rest and :meth:`Codebook.mean_shift`
    on the rows would give, without refitting. A window of the reference scored against the whole
    reference looks far closer to it than new data does (its rows helped estimate the covariance, so
    their deviations are "explained"); against the rest it is new data.

    In the eigenbasis of the reference's scatter matrix the rest's shrunk covariance is a diagonal
    matrix less a low-rank term (the rows taken out and the move of the mean), so the Woodbury identity
    gives the quadratic form with one small solve per call."""

    def __init__(self, x: np.ndarray, shrinkage: float = SHRINKAGE):
        x = np.asarray(x, dtype=np.float64)
        self.n, self.dim = x.shape
        self.shrinkage = shrinkage
        mean = x.mean(axis=0)
        scatter = (x - mean).T @ (x - mean)
        eig, vecs = np.linalg.eigh(scatter)
        self.eig = np.maximum(eig, 0.0)
        self.y = (x - mean) @ vecs  # centred on the whole reference's mean, in the eigenbasis
        self.trace = float(np.trace(scatter))

    def shift(self, rows: np.ndarray) -> float:
        """``mean_shift`` of the reference rows ``rows`` against the others."""
        w = self.y[rows]
        m, d, s = len(w), self.dim, self.shrinkage
        rest = self.n - m
        mean_rest = -w.sum(axis=0) / rest  # the whole reference's centred sum is 0
        delta = w.mean(axis=0) - mean_rest
        beta = (1 - s) / (rest - 1)
        tau = (self.trace - float((w * w).sum()) - rest * float(mean_rest @ mean_rest)) / ((rest - 1) * d)
        # rest's shrunk covariance = beta * (S - U U^T) + s tau I, S = diag(eig), U = [rows, sqrt(rest) mean_rest]
        d_inv = 1.0 / np.maximum(beta * self.eig + s * tau, 1e-12)
        u = np.vstack([w, np.sqrt(rest) * mean_rest]).T
        du = u * d_inv[:, None]
        inner = np.eye(m + 1) / beta - u.T @ du
        b = du.T @ delta
        q = float(delta @ (d_inv * delta) + b @ np.linalg.solve(inner, b))
        return (m * q - d) / float(np.sqrt(2 * d))


def _whitener(x: np.ndarray, shrinkage: float) -> np.ndarray:
    """(1 - s) C + s (tr C / d) I, to the power -1/2 (symmetric), as float32."""
    c = np.cov(x, rowvar=False)
    c = np.atleast_2d(c)
    d = c.shape[0]
    c = (1 - shrinkage) * c + shrinkage * (np.trace(c) / d) * np.eye(d)
    vals, vecs = np.linalg.eigh(c)
    vals = np.maximum(vals, 1e-12)
    return ((vecs / np.sqrt(vals)) @ vecs.T).astype(np.float32)


def _kmeans_pp(y: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """k-means++ seeding with cosine distance (1 - cos)."""
    first = int(rng.integers(len(y)))
    centroids = [y[first]]
    dist = 1.0 - y @ y[first]
    for _ in range(1, k):
        d = np.clip(dist, 0.0, None)
        total = d.sum()
        idx = int(rng.choice(len(y), p=d / total)) if total > 0 else int(rng.integers(len(y)))
        centroids.append(y[idx])
        dist = np.minimum(dist, 1.0 - y @ y[idx])
    return np.array(centroids, dtype=np.float64)
