"""Information measures over code counts, in bits.

Plug-in (maximum-likelihood) estimates from counts; the only smoothing is the stated one: divergences
compare a window's empirical distribution P with a reference Q smoothed by adding ``alpha`` to every
cell (Krichevsky-Trofimov, alpha = 1/2, by default), so Q has no empty cell and KL(P || Q) is finite.
"""

from __future__ import annotations

import numpy as np

#: Pseudo-count added to every cell of the reference distribution before a divergence is taken.
REFERENCE_ALPHA = 0.5


def _probabilities(counts: np.ndarray) -> np.ndarray:
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum()
    if total <= 0:
        raise ValueError("no counts")
    return counts / total


def entropy(counts: np.ndarray) -> float:
    """Shannon entropy H(X) of the distribution the counts estimate."""
    p = _probabilities(counts).ravel()
    p = p[p > 0]
    return float(-(p * np.log2(p)).sum())


def mutual_information(joint: np.ndarray) -> float:
    """I(X; Y) = H(X) + H(Y) - H(X, Y) from a 2-D table of joint counts."""
    joint = np.asarray(joint, dtype=np.float64)
    if joint.ndim != 2:
        raise ValueError("a joint table of counts is 2-D")
    value = entropy(joint.sum(axis=1)) + entropy(joint.sum(axis=0)) - entropy(joint)
    return max(value, 0.0)


def smoothed(counts: np.ndarray, alpha: float = REFERENCE_ALPHA) -> np.ndarray:
    """The distribution of ``counts`` with ``alpha`` added to every cell."""
    counts = np.asarray(counts, dtype=np.float64) + alpha
    return counts / counts.sum()


def kl_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """KL(P || Q) between two distributions over the same cells; Q must cover P's support."""
    p = np.asarray(p, dtype=np.float64).ravel()
    q = np.asarray(q, dtype=np.float64).ravel()
    mask = p > 0
    if np.any(q[mask] <= 0):
        raise ValueError("Q has an empty cell where P has mass: smooth the reference")
    return float((p[mask] * np.log2(p[mask] / q[mask])).sum())


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen-Shannon divergence, in bits (between 0 and 1)."""
    p = np.asarray(p, dtype=np.float64).ravel()
    q = np.asarray(q, dtype=np.float64).ravel()
    m = (p + q) / 2
    return max(0.5 * kl_divergence(p, m) + 0.5 * kl_divergence(q, m), 0.0)
