"""Entropy, mutual information and divergences against closed forms; EWMA thresholds on constructed
series; the codebook's determinism and pinning."""

from __future__ import annotations

import math

import numpy as np
import pytest

from mmlake.preprocessing.drift.codebook import Codebook, LeaveOut
from mmlake.preprocessing.drift.ewma import Ewma
from mmlake.preprocessing.drift.measures import entropy, js_divergence, kl_divergence, mutual_information, smoothed
from mmlake.preprocessing.errors import DriftStateError


def test_entropy_closed_forms() -> None:
    assert entropy(np.array([5, 5, 5, 5])) == pytest.approx(2.0)
    assert entropy(np.array([7, 0, 0])) == pytest.approx(0.0)
    # H(1/2, 1/4, 1/4) = 1.5 bits; counts scale does not matter.
    assert entropy(np.array([200, 100, 100])) == pytest.approx(1.5)
    p = 0.1
    assert entropy(np.array([p, 1 - p]) * 1000) == pytest.approx(-p * math.log2(p) - (1 - p) * math.log2(1 - p))


def test_mutual_information_closed_forms() -> None:
    # Identical variables over 4 equiprobable values: I = H = 2 bits.
    assert mutual_information(np.eye(4) * 10) == pytest.approx(2.0)
    # Independent: the outer product of marginals has I = 0.
    assert mutual_information(np.outer([1, 3], [2, 2, 4]) * 5) == pytest.approx(0.0, abs=1e-12)
    # Binary symmetric channel with crossover e on a fair bit: I = 1 - h(e).
    e = 0.2
    joint = np.array([[1 - e, e], [e, 1 - e]]) * 500
    h = -e * math.log2(e) - (1 - e) * math.log2(1 - e)
    assert mutual_information(joint) == pytest.approx(1 - h)


def test_divergences_closed_forms() -> None:
    p, q = np.array([0.5, 0.5]), np.array([0.25, 0.75])
    assert kl_divergence(p, q) == pytest.approx(0.5 * math.log2(2) + 0.5 * math.log2(0.5 / 0.75))
    assert kl_divergence(p, p) == pytest.approx(0.0)
    # Disjoint supports: JS is exactly 1 bit.
    assert js_divergence(np.array([1.0, 0.0]), np.array([0.0, 1.0])) == pytest.approx(1.0)
    assert js_divergence(p, q) == pytest.approx(js_divergence(q, p))
    with pytest.raises(ValueError, match="smooth"):
        kl_divergence(np.array([0.5, 0.5]), np.array([1.0, 0.0]))
    # Jeffreys smoothing of counts (3, 0, 1): (3.5, 0.5, 1.5) / 5.5.
    assert smoothed(np.array([3, 0, 1])) == pytest.approx(np.array([3.5, 0.5, 1.5]) / 5.5)


def _ewma(direction: str = "above", **kw) -> Ewma:
    args = {"k": 3.0, "lam": 0.1, "warmup": 10, "confirm": 2, "clear": 3, "floor": 0.0} | kw
    return Ewma(direction, **args)  # type: ignore[arg-type]


def test_ewma_warmup_then_thresholds_from_mean_and_sigma() -> None:
    e = _ewma()
    series = [1.0, 3.0] * 5  # mean 2, sample sd sqrt(10/9)
    verdicts = [e.update(x) for x in series]
    assert all(v.status == "warmup" and v.threshold is None and not v.alarm for v in verdicts)
    v = e.update(2.0)
    sd = math.sqrt(10 / 9)
    assert v.high == pytest.approx(2 + 3 * sd) and v.low == pytest.approx(2 - 3 * sd)
    assert v.threshold == pytest.approx(2 + 3 * sd) and v.status == "ok"


def test_ewma_raises_after_confirm_and_clears_after_clear() -> None:
    e = _ewma()
    for x in [1.0, 3.0] * 5:
        e.update(x)
    high = e.bounds()[1]
    first = e.update(high + 1)
    assert first.status == "beyond" and not first.alarm  # one window beyond: not yet
    second = e.update(high + 1)
    assert second.alarm and second.event == "raised"
    # While alarmed, values beyond do not move the statistics.
    frozen = (e.mean, e.var)
    e.update(high + 50)
    assert (e.mean, e.var) == frozen
    events = [e.update(2.0) for _ in range(3)]
    assert [v.alarm for v in events] == [True, True, False] and events[-1].event == "cleared"


def test_ewma_below_direction_and_sigma_floor() -> None:
    e = _ewma("below", sigma_min=0.5, warmup=4)
    for x in (2.0, 2.0, 2.0, 2.0):  # constant warm-up: sigma from the floor, not zero
        e.update(x)
    low, high = e.bounds()
    assert low == pytest.approx(2 - 1.5) and high == pytest.approx(2 + 1.5)
    assert not e.update(5.0).alarm and e.update(5.0).status == "ok"  # 'below' ignores a rise
    e.update(0.0)
    assert e.update(0.0).event == "raised"


def test_ewma_learns_a_slow_level_change_but_not_past_the_warmup_envelope() -> None:
    e = _ewma(warmup=20, lam=0.2, confirm=1, sigma_min=0.1)
    rng = np.random.default_rng(0)
    for x in 1 + 0.1 * rng.standard_normal(20):
        e.update(float(x))
    base_high = e.base_high
    # A slow ramp is partly learnt by the EWMA mean, but the bound never goes past the envelope.
    alarms = [e.update(1 + 0.02 * i).alarm for i in range(200)]
    assert any(alarms)
    assert e.bounds()[1] <= base_high + 1e-12


def test_a_calibrated_ewma_scores_its_first_value_against_the_known_null() -> None:
    e = Ewma.calibrated("above", 3.0, 0.1, 2, 3, 0.0, mean=2.0, sigma=0.5)
    assert e.bounds() == (pytest.approx(0.5), pytest.approx(3.5))
    first = e.update(4.0)  # no warm-up: the very first value is judged
    assert first.status == "beyond" and first.threshold == pytest.approx(3.5)
    assert e.update(4.0).event == "raised"
    # In-bounds values move the mean, never the band past the calibrated envelope, nor sigma below it.
    e = Ewma.calibrated("above", 3.0, 0.5, 2, 3, 0.0, mean=2.0, sigma=0.5)
    for _ in range(50):
        e.update(3.4)
    low, high = e.bounds()
    assert high == pytest.approx(3.5) and low == pytest.approx(e.mean - 1.5) and e.mean > 3.3
    for _ in range(50):
        e.update(0.6)
    assert e.bounds()[0] == pytest.approx(0.5)
    assert e.bounds()[1] == pytest.approx(e.mean + 1.5) and e.bounds()[1] < 3.5  # a quieter level tightens the band
    restored = Ewma.from_state(e.state())
    assert restored.bounds() == e.bounds() and restored.update(9.0).status == "beyond"


def test_leave_out_shift_equals_a_codebook_refitted_without_the_rows() -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 24)) @ rng.standard_normal((24, 24)) + 2.0
    rows = np.sort(rng.choice(300, size=40, replace=False))
    rest = np.delete(x, rows, axis=0)
    # Independently: fit a codebook on the rest and measure the rows' mean shift the ordinary way.
    expected = Codebook.fit("image", rest, 4, seed=0).mean_shift(x[rows])
    assert LeaveOut(x).shift(rows) == pytest.approx(expected, rel=1e-4, abs=1e-4)
    # Against the whole reference (rows included) the same rows look closer than they are.
    assert Codebook.fit("image", x, 4, seed=0).mean_shift(x[rows]) < expected - 0.3


def test_codebook_is_deterministic_and_pinned() -> None:
    rng = np.random.default_rng(1)
    centres = rng.standard_normal((4, 8)) * 3
    x = np.concatenate([c + 0.1 * rng.standard_normal((50, 8)) for c in centres])
    a = Codebook.fit("image", x, 4, seed=0)
    b = Codebook.fit("image", x, 4, seed=0)
    assert a.sha256 == b.sha256
    codes = a.assign(x)
    # Four well-separated clusters: each keeps one code.
    assert [len(set(codes[i * 50 : (i + 1) * 50].tolist())) for i in range(4)] == [1, 1, 1, 1]
    assert len(set(codes.tolist())) == 4
    row = a.to_row()
    assert Codebook.from_row(row).sha256 == a.sha256
    row["centroids"] = list(row["centroids"])  # type: ignore[call-overload]
    row["centroids"][0] += 1e-3  # type: ignore[index]
    with pytest.raises(DriftStateError, match="refusing a changed codebook"):
        Codebook.from_row(row)
