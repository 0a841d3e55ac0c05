"""Sliding-window drift detection over a stream of multimodal samples.

A *sample* is the parts that share a sample id (an image, its caption, perhaps a clip of audio), with
one embedding per modality. The first ``reference`` samples form the reference window: a codebook per
modality is fitted on them (see :mod:`.codebook`) and their code distributions become the reference.
From then on, every ``step`` samples, the last ``window`` samples are scored:

- ``entropy.<m>``: Shannon entropy of modality m's codes (two-sided);
- ``js.<m>``: Jensen-Shannon divergence of m's code distribution from the reference (rises);
- ``shift.<m>``: how far the window's mean embedding lies from the reference mean (a standardised
  chi-square, about 0 without drift): the first-moment check that quantisation cannot see, for shifts
  smaller than a code cell;
- ``mi.<a>-<b>``: mutual information between the codes of the parts of one sample (falls when the parts
  stop matching: a pairing shuffle leaves every marginal unchanged but collapses it);
- ``mi_decay.<a>-<b>``: how fast that mutual information falls, bits per window step (least-squares
  slope over the last ``decay_windows`` windows, negated);
- ``kl.<joint>`` / ``js.<joint>``: divergence of the joint code distribution of the dense modalities
  (present in at least half the reference samples) from the reference.

Entropy, MI and KL are Miller-Madow corrected so windows with some invalid parts stay comparable.
Each metric has its own EWMA threshold (:mod:`.ewma`). A metric whose valid parts in a window are fewer
than ``min_valid`` of what the reference leads one to expect is skipped for that window (value null, the
reason in ``note``): missing data never raises an alarm, and every invalid part is counted.

Part status codes: >= 0 a code; -1 missing; -2 NaN or infinite embedding; -3 zero-norm embedding;
-4 a features row with an error (the operator could not encode the part).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from itertools import combinations
from typing import Any

import numpy as np
from pydantic import ConfigDict

from mmlake.errors import InputError
from mmlake.preprocessing.drift.codebook import Codebook, LeaveOut
from mmlake.preprocessing.drift.ewma import Direction, Ewma
from mmlake.preprocessing.drift.measures import entropy, js_divergence, smoothed
from mmlake.preprocessing.drift.settings import DriftParameters, DriftSettings
from mmlake.preprocessing.errors import DriftStateError

MISSING, NAN, ZERO_NORM, ERROR = -1, -2, -3, -4
STATUS_NAMES = {MISSING: "missing", NAN: "NaN", ZERO_NORM: "zero-norm", ERROR: "error"}
_LN2 = math.log(2)
#: Windows drawn out of the reference to calibrate each metric's null distribution.
CALIBRATION_DRAWS = 256


class DriftConfig(DriftParameters):
    """The detector's configuration: :class:`DriftParameters` (as :class:`DriftSettings` gives them, or as
    a drift table was scored with) and the EWMA's sigma floor. Windows and reference are checked at
    construction (an :class:`InputError`)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    sigma_floor: float = 0.01

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        if self.window < 8 or self.step < 1 or self.step > self.window:
            raise InputError(f"drift windows need window >= 8 and 1 <= step <= window (got {self.window}, {self.step})")
        if self.reference < self.least_reference:
            raise InputError(
                f"a reference of {self.reference} samples is too small for {self.codes} codes and "
                f"{self.window}-sample windows (at least {self.least_reference})"
            )

    @classmethod
    def of(cls, settings: DriftSettings) -> DriftConfig:
        """The configuration of ``settings``, field for field."""
        return cls(**settings.model_dump())

    @property
    def least_reference(self) -> int:
        """The fewest samples a reference may hold: two per code and, without a warm-up, two windows
        (the thresholds are calibrated on windows drawn out of it, each against the rest)."""
        return max(2 * self.codes, 0 if self.warmup else 2 * self.window)

    @property
    def sha256(self) -> str:
        """The digest a drift table records of the configuration it was scored with."""
        return hashlib.sha256(json.dumps(self.model_dump(), sort_keys=True).encode()).hexdigest()


@dataclass
class Samples:
    """Samples in event-time order: their times (epoch µs), ids and, per modality, embeddings (rows of
    invalid parts are ignored) and a status per sample (0 valid, or one of the negative codes)."""

    times: np.ndarray
    ids: list[str]
    embeddings: dict[str, np.ndarray]
    status: dict[str, np.ndarray]

    def __len__(self) -> int:
        return len(self.ids)

    def slice(self, lo: int, hi: int) -> Samples:
        return Samples(
            self.times[lo:hi],
            self.ids[lo:hi],
            {m: e[lo:hi] for m, e in self.embeddings.items()},
            {m: s[lo:hi] for m, s in self.status.items()},
        )

    @classmethod
    def empty(cls, modalities: list[str], dim: int = 0) -> Samples:
        return cls(
            np.zeros(0, dtype=np.int64),
            [],
            {m: np.zeros((0, dim), dtype=np.float32) for m in modalities},
            {m: np.zeros(0, dtype=np.int8) for m in modalities},
        )

    @classmethod
    def concat(cls, parts: list[Samples], modalities: list[str]) -> Samples:
        """Samples one after another, with every modality of ``modalities`` (missing where a part lacks it)."""
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty(modalities)
        if len(parts) == 1 and all(m in parts[0].embeddings for m in modalities):
            return parts[0]
        emb, status = {}, {}
        for m in modalities:
            dim = next((p.embeddings[m].shape[1] for p in parts if m in p.embeddings), 0)
            emb[m] = np.concatenate(
                [
                    p.embeddings[m] if m in p.embeddings else np.full((len(p), dim), np.nan, dtype=np.float32)
                    for p in parts
                ]
            )
            status[m] = np.concatenate(
                [p.status[m] if m in p.status else np.full(len(p), MISSING, dtype=np.int8) for p in parts]
            )
        return cls(np.concatenate([p.times for p in parts]), [i for p in parts for i in p.ids], emb, status)

    @classmethod
    def build(
        cls,
        times: np.ndarray,
        ids: list[str],
        embeddings: dict[str, np.ndarray],
        errors: dict[str, np.ndarray] | None = None,
    ) -> Samples:
        """Status from the embeddings: NaN rows of a modality's matrix that are all-NaN are missing parts
        unless ``errors`` marks them; other non-finite rows are NaN parts; zero rows are zero-norm."""
        status = {}
        for m, e in embeddings.items():
            s = np.zeros(len(ids), dtype=np.int8)
            finite = np.isfinite(e).all(axis=1)
            all_nan = np.isnan(e).all(axis=1)
            s[~finite] = NAN
            s[all_nan] = MISSING
            s[finite & (np.abs(e).sum(axis=1) == 0)] = ZERO_NORM
            if errors is not None and m in errors:
                s[errors[m]] = ERROR
            status[m] = s
        return cls(np.asarray(times, dtype=np.int64), list(ids), embeddings, status)


@dataclass
class Reference:
    """What the windows are compared with: codebooks and the reference code counts."""

    codebooks: dict[str, Codebook]
    presence: dict[str, float]  # modality or "a-b" pair or joint name -> share of reference samples valid
    marginal: dict[str, list[float]]
    joint_modalities: list[str]
    joint: list[float]  # flattened counts over the joint codes
    skipped: dict[str, str] = field(default_factory=dict)  # modality -> why it is not monitored
    null_sigma: dict[str, float] = field(default_factory=dict)  # metric -> its null distribution's spread
    null_mean: dict[str, float] = field(default_factory=dict)  # metric -> its null distribution's mean

    def smoothed(self, alpha: float) -> tuple[dict[str, np.ndarray], np.ndarray | None]:
        q = {m: smoothed(np.asarray(c), alpha) for m, c in self.marginal.items()}
        return q, (smoothed(np.asarray(self.joint), alpha) if len(self.joint_modalities) >= 2 else None)

    @property
    def sha256(self) -> str:
        h = hashlib.sha256()
        for m in sorted(self.codebooks):
            h.update(f"{m}:{self.codebooks[m].sha256}\n".encode())
        return h.hexdigest()

    @property
    def pairs(self) -> list[tuple[str, str]]:
        return list(combinations(sorted(self.codebooks), 2))

    @property
    def joint_name(self) -> str:
        return "+".join(self.joint_modalities)

    def metrics(self) -> dict[str, Direction]:
        out: dict[str, Direction] = {}
        for m in sorted(self.codebooks):
            out[f"entropy.{m}"] = "both"
            out[f"js.{m}"] = "above"
            out[f"shift.{m}"] = "above"
        for a, b in self.pairs:
            out[f"mi.{a}-{b}"] = "below"
            out[f"mi_decay.{a}-{b}"] = "above"
        if len(self.joint_modalities) >= 2:
            out[f"kl.{self.joint_name}"] = "above"
            out[f"js.{self.joint_name}"] = "above"
        return out

    def as_state(self) -> dict[str, Any]:
        return {
            "codebooks": {m: b.sha256 for m, b in self.codebooks.items()},
            "presence": self.presence,
            "marginal": self.marginal,
            "joint_modalities": self.joint_modalities,
            "joint": self.joint,
            "skipped": self.skipped,
            "null_sigma": self.null_sigma,
            "null_mean": self.null_mean,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], codebooks: dict[str, Codebook]) -> Reference:
        return cls(
            codebooks,
            state["presence"],
            state["marginal"],
            state["joint_modalities"],
            state["joint"],
            state.get("skipped", {}),
            state.get("null_sigma", {}),
            state.get("null_mean", {}),
        )

    @classmethod
    def fit(cls, samples: Samples, config: DriftConfig) -> Reference:
        """Fit the codebooks on ``samples`` (the reference window) and count their codes."""
        n = len(samples)
        codebooks: dict[str, Codebook] = {}
        skipped: dict[str, str] = {}
        least = max(4 * config.codes, 16)
        for m in sorted(samples.embeddings):
            valid = samples.status[m] == 0
            if valid.sum() < least:
                skipped[m] = (
                    f"{int(valid.sum())} valid {m} embeddings in the {n}-sample reference, "
                    f"fewer than {least}: not monitored"
                )
                continue
            codebooks[m] = Codebook.fit(m, samples.embeddings[m][valid], config.codes, seed=config.seed)
        if not codebooks:
            raise InputError(f"no modality has enough valid embeddings in the {n}-sample reference to monitor")
        codes = encode(samples, codebooks)
        presence = {m: float((c >= 0).mean()) for m, c in codes.items()}
        for a, b in combinations(sorted(codebooks), 2):
            presence[f"{a}-{b}"] = float(((codes[a] >= 0) & (codes[b] >= 0)).mean())
        joint_modalities = [m for m in sorted(codebooks) if presence[m] >= 0.5]
        marginal = {m: np.bincount(c[c >= 0], minlength=config.codes).astype(float).tolist() for m, c in codes.items()}
        joint_codes, ok = _joint(codes, joint_modalities, config.codes)
        presence["+".join(joint_modalities)] = float(ok.mean())
        joint = np.bincount(joint_codes[ok], minlength=config.codes ** len(joint_modalities)).astype(float)
        ref = cls(codebooks, presence, marginal, joint_modalities, joint.tolist(), skipped)
        ref.null_mean, ref.null_sigma = _calibrate(ref, config, samples, codes)
        return ref


def _calibrate(
    ref: Reference, cfg: DriftConfig, samples: Samples, codes: dict[str, np.ndarray], draws: int = CALIBRATION_DRAWS
) -> tuple[dict[str, float], dict[str, float]]:
    """Each metric's null distribution (mean, spread), from ``draws`` windows drawn at random out of
    the reference, each scored against *the rest of the reference*: code counts and mean embedding
    without the window's samples, so the window is new data to what it is compared with, as a window
    after the reference is. (Scored against the whole reference, a window of it would look closer to
    it than new data does: the reference's own estimation error would be shared.) The rest is a
    reference of ``n - window`` samples instead of ``n``, which puts the null's divergences a little
    higher than the real ones: a conservative error (fewer false alarms, not more)."""
    rng = np.random.default_rng(cfg.seed)
    n = len(samples)
    size = min(cfg.window, n // 2)
    k = cfg.codes
    marginal = {m: np.asarray(c, dtype=float) for m, c in ref.marginal.items()}
    joint = np.asarray(ref.joint, dtype=float)
    valid = {m: codes[m] >= 0 for m in ref.codebooks}
    row_of = {m: np.cumsum(v) - 1 for m, v in valid.items()}  # sample -> row among the valid parts
    shifts = {m: LeaveOut(samples.embeddings[m][valid[m]]) for m in ref.codebooks}
    seen: dict[str, list[float]] = {}
    for _ in range(draws):
        idx = np.sort(rng.choice(n, size=size, replace=False))
        window = {m: c[idx] for m, c in codes.items()}
        rest_marginal = {
            m: (marginal[m] - np.bincount(window[m][window[m] >= 0], minlength=k)).tolist() for m in ref.codebooks
        }
        rest_joint = ref.joint
        if len(ref.joint_modalities) >= 2:
            flat, ok = _joint(window, ref.joint_modalities, k)
            rest_joint = (joint - np.bincount(flat[ok], minlength=len(joint))).tolist()
        rest = Reference(ref.codebooks, ref.presence, rest_marginal, ref.joint_modalities, rest_joint)
        values, _ = window_values(rest, cfg, window, {m: samples.embeddings[m][idx] for m in ref.codebooks})
        for m in ref.codebooks:
            value, parts, why = values[f"shift.{m}"]
            if value is not None:  # against the rest's own mean and covariance (see LeaveOut)
                values[f"shift.{m}"] = (shifts[m].shift(row_of[m][idx][window[m] >= 0]), parts, why)
        for metric, (value, _, _) in values.items():
            if value is not None:
                seen.setdefault(metric, []).append(value)
    for a, b in ref.pairs:
        # The decay rate of MI over runs of independent windows: more spread than over the
        # overlapping windows of a stream (conservative again), centred where a steady MI puts it.
        mi = seen.get(f"mi.{a}-{b}", [])
        d = cfg.decay_windows
        slopes = [_decay(mi[i : i + d]) for i in range(0, len(mi) - d + 1, d)]
        if slopes:
            seen[f"mi_decay.{a}-{b}"] = slopes
    means = {metric: float(np.mean(v)) for metric, v in seen.items() if len(v) > 1}
    sigmas = {metric: float(np.std(v, ddof=1)) for metric, v in seen.items() if len(v) > 1}
    return means, sigmas


def encode(samples: Samples, codebooks: dict[str, Codebook]) -> dict[str, np.ndarray]:
    """Codes per monitored modality: the centroid index of each valid part, the status of the others."""
    out = {}
    for m, book in codebooks.items():
        status = samples.status.get(m)
        if status is None:
            out[m] = np.full(len(samples), MISSING, dtype=np.int64)
            continue
        codes = status.astype(np.int64)
        valid = status == 0
        if valid.any():
            codes[valid] = book.assign(samples.embeddings[m][valid])
        out[m] = codes
    return out


def _joint(codes: dict[str, np.ndarray], modalities: list[str], k: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(next(iter(codes.values()))) if codes else 0
    flat = np.zeros(n, dtype=np.int64)
    ok = np.ones(n, dtype=bool)
    for m in modalities:
        ok &= codes[m] >= 0
        flat = flat * k + np.where(codes[m] >= 0, codes[m], 0)
    return flat, ok


def entropy_mm(counts: np.ndarray) -> float:
    """Miller-Madow corrected entropy: plug-in + (cells seen - 1) / (2 N ln 2)."""
    n = float(counts.sum())
    return entropy(counts) + (np.count_nonzero(counts) - 1) / (2 * n * _LN2)


class Detector:
    """Scores windows of coded samples; its state (tail of the last window, EWMA statistics) carries
    over between calls and runs, so feeding samples in any number of pieces gives the same rows."""

    def __init__(
        self,
        config: DriftConfig,
        reference: Reference,
        state: dict[str, Any] | None = None,
        tail: Samples | None = None,
    ):
        """``state`` from :meth:`state` of an earlier run; ``tail`` the samples it names in ``tail_ids``
        (the start of the next window), re-read from the features table."""
        self.config = config
        self.reference = reference
        self.directions = reference.metrics()
        state = state or {}
        self.next_window = int(state.get("next_window", 0))
        self.seen = int(state.get("seen", 0))  # samples fed since the reference
        expected = list(state.get("tail_ids", []))
        tail = tail if tail is not None else Samples.empty(list(reference.codebooks))
        if tail.ids != expected:
            raise InputError(f"the drift state expects {len(expected)} tail samples, {len(tail.ids)} were given")
        self._tail = tail
        self._tail_codes = encode(tail, reference.codebooks)
        self.ewma = {name: Ewma.from_state(s) for name, s in state.get("ewma", {}).items()}
        # Without a warm-up (the default) each threshold starts from its metric's null distribution on
        # the reference; a metric the reference could not calibrate is not scored (its rows say why).
        self.uncalibrated: set[str] = set()
        if config.warmup == 0 and not reference.null_mean:
            raise DriftStateError(
                "the pinned reference predates thresholds calibrated on the reference (it "
                "was fitted for a warm-up): `mmlake drift --rebuild`"
            )
        for name, direction in self.directions.items():
            if name in self.ewma:
                continue
            sigma = reference.null_sigma.get(name, 0.0)
            if config.warmup:
                self.ewma[name] = Ewma(
                    direction,
                    config.k,
                    config.ewma_lambda,
                    config.warmup,
                    config.confirm,
                    config.clear,
                    config.sigma_floor,
                    sigma_min=sigma,
                )
            elif name in reference.null_mean:
                self.ewma[name] = Ewma.calibrated(
                    direction,
                    config.k,
                    config.ewma_lambda,
                    config.confirm,
                    config.clear,
                    config.sigma_floor,
                    reference.null_mean[name],
                    sigma,
                )
            else:
                self.uncalibrated.add(name)
        self.mi_history: dict[str, list[float]] = {p: list(v) for p, v in state.get("mi_history", {}).items()}

    def state(self) -> dict[str, Any]:
        return {
            "next_window": self.next_window,
            "seen": self.seen,
            "tail_ids": list(self._tail.ids),
            "tail_from_us": int(self._tail.times[0]) if len(self._tail) else None,
            "ewma": {name: e.state() for name, e in self.ewma.items()},
            "mi_history": self.mi_history,
        }

    def feed(self, samples: Samples) -> list[dict[str, Any]]:
        """Score every window completed by ``samples``; rows as the drift table holds them."""
        allx = Samples.concat([self._tail, samples], list(self.reference.codebooks))
        new = encode(samples, self.reference.codebooks)
        allc = {m: np.concatenate([self._tail_codes[m], new[m]]) for m in self.reference.codebooks}
        offset = self.seen - len(self._tail)  # sample number (since the reference) of allx[0]
        self.seen += len(samples)
        rows: list[dict[str, Any]] = []
        w, s = self.config.window, self.config.step
        while True:
            start = self.next_window * s  # first sample of the window, since the reference
            if start + w > self.seen:
                break
            lo = start - offset
            emb = {m: allx.embeddings[m][lo : lo + w] for m in self.reference.codebooks}
            rows.extend(
                self._score(
                    {m: c[lo : lo + w] for m, c in allc.items()},
                    emb,
                    int(allx.times[lo]),
                    int(allx.times[lo + w - 1]),
                    start,
                )
            )
            self.next_window += 1
        cut = self.next_window * s - offset  # the next window's first sample: keep it and what follows
        self._tail = allx.slice(cut, len(allx))
        self._tail_codes = {m: c[cut:] for m, c in allc.items()}
        return rows

    def _score(
        self, codes: dict[str, np.ndarray], embeddings: dict[str, np.ndarray], t0: int, t1: int, first: int
    ) -> list[dict[str, Any]]:
        cfg = self.config
        values, notes = window_values(self.reference, cfg, codes, embeddings)
        for a, b in self.reference.pairs:
            pair = f"{a}-{b}"
            mi, n, why = values[f"mi.{pair}"]
            history = self.mi_history.setdefault(pair, [])
            decay: float | None = None
            if mi is not None:
                history.append(mi)
                del history[: -cfg.decay_windows]
                if len(history) == cfg.decay_windows:
                    decay = _decay(history)
            values[f"mi_decay.{pair}"] = (
                decay,
                n,
                why
                or (
                    None
                    if decay is not None
                    else f"skipped: {len(history)} of {cfg.decay_windows} windows of MI history"
                ),
            )
        rows = []
        for metric in self.directions:
            value, n, why = values[metric]
            modal = metric.split(".", 1)[1].replace("-", "+").split("+")
            note = "; ".join(x for x in [why] + [v for m, v in notes.items() if m in modal] if x) or None
            if metric in self.uncalibrated:
                rows.append(
                    _row(
                        first,
                        t0,
                        t1,
                        metric,
                        None,
                        None,
                        None,
                        None,
                        False,
                        None,
                        "skipped",
                        n,
                        "skipped: too few valid parts in the reference windows to calibrate it",
                    )
                )
                continue
            if value is None:
                rows.append(
                    _row(
                        first, t0, t1, metric, None, None, None, None, self.ewma[metric].alarm, None, "skipped", n, note
                    )
                )
                continue
            v = self.ewma[metric].update(value)
            rows.append(
                _row(first, t0, t1, metric, value, v.threshold, v.low, v.high, v.alarm, v.event, v.status, n, note)
            )
        return rows


def _decay(history: list[float]) -> float:
    """Negated least-squares slope of MI over consecutive windows (bits per window step)."""
    x = np.arange(len(history), dtype=float)
    return -float(np.polyfit(x, np.asarray(history), 1)[0])


def window_values(
    reference: Reference, cfg: DriftConfig, codes: dict[str, np.ndarray], embeddings: dict[str, np.ndarray]
) -> tuple[dict[str, tuple[float | None, int, str | None]], dict[str, str]]:
    """Every metric but the MI decay for one window: (value or None when skipped, valid parts, why)."""
    k, w = cfg.codes, cfg.window
    values: dict[str, tuple[float | None, int, str | None]] = {}
    notes: dict[str, str] = {}
    for m, c in codes.items():
        bad = {STATUS_NAMES[v]: int((c == v).sum()) for v in (NAN, ZERO_NORM, ERROR) if (c == v).any()}
        if bad:
            notes[m] = f"{m}: " + ", ".join(f"{n} {name}" for name, n in bad.items()) + " (not used)"

    def enough(key: str, n: int, what: str) -> str | None:
        expected = w * reference.presence.get(key, 0.0)
        if n < max(cfg.min_valid * expected, 2):
            return f"skipped: {n} valid {what} of {expected:.0f} expected"
        return None

    q_marginal, q_joint = reference.smoothed(cfg.alpha)
    for m, c in codes.items():
        ok = c >= 0
        valid = c[ok]
        why = enough(m, len(valid), m)
        counts = np.bincount(valid, minlength=k)
        values[f"entropy.{m}"] = (None if why else entropy_mm(counts), len(valid), why)
        values[f"js.{m}"] = (
            None if why else js_divergence(counts / max(len(valid), 1), q_marginal[m]),
            len(valid),
            why,
        )
        values[f"shift.{m}"] = (None if why else reference.codebooks[m].mean_shift(embeddings[m][ok]), len(valid), why)
    for a, b in reference.pairs:
        ok = (codes[a] >= 0) & (codes[b] >= 0)
        n = int(ok.sum())
        why = enough(f"{a}-{b}", n, f"{a}-{b} pairs")
        mi: float | None = None
        if not why:
            joint = np.zeros((k, k))
            np.add.at(joint, (codes[a][ok], codes[b][ok]), 1)
            mi = max(entropy_mm(joint.sum(1)) + entropy_mm(joint.sum(0)) - entropy_mm(joint.ravel()), 0.0)
        values[f"mi.{a}-{b}"] = (mi, n, why)
    if q_joint is not None:
        name = reference.joint_name
        flat, ok = _joint(codes, reference.joint_modalities, k)
        n = int(ok.sum())
        why = enough(name, n, f"{name} samples")
        kl = js = None
        if not why:
            counts = np.bincount(flat[ok], minlength=k ** len(reference.joint_modalities)).astype(float)
            p = counts / n
            mask = p > 0
            cross = float(-(p[mask] * np.log2(q_joint[mask])).sum())
            kl = max(cross - entropy_mm(counts), 0.0)
            js = js_divergence(p, q_joint)
        values[f"kl.{name}"] = (kl, n, why)
        values[f"js.{name}"] = (js, n, why)
    return values, notes


def _row(
    first: int,
    t0: int,
    t1: int,
    metric: str,
    value: float | None,
    threshold: float | None,
    low: float | None,
    high: float | None,
    alarm: bool,
    event: str | None,
    status: str,
    valid: int,
    note: str | None,
) -> dict[str, Any]:
    return {
        "first_sample": first,
        "window_start": int(t0),
        "window_end": int(t1),
        "metric": metric,
        "value": value,
        "threshold": threshold,
        "threshold_low": low,
        "threshold_high": high,
        "alarm": bool(alarm),
        "event": event,
        "status": status,
        "valid": valid,
        "note": note,
    }
