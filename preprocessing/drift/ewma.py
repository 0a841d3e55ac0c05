"""EWMA adaptive thresholds: mean +- k sigma of a metric's recent values, after a warm-up.

The first ``warmup`` values only estimate the mean and variance (no alarm can be raised). After that
each value is compared with the bounds; values inside them move the exponentially weighted mean and
variance (weight ``lam``); values beyond them do not, so a drift is not learnt as normal while it is
being reported. A slow drift would still be learnt, a little at a time, so the bounds never reach past
the warm-up envelope (warm-up mean +- k sigma): the effective bound on each side is the tighter one. An
alarm is raised after ``confirm`` consecutive values beyond the bounds and cleared after ``clear``
consecutive values back inside. sigma never falls below ``sigma_min`` (given by the caller:
the detector's resampled-reference spread) nor ``floor`` times |mean| (a metric that happened to be
constant during the warm-up would otherwise alarm on any change).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Literal

Direction = Literal["above", "below", "both"]


@dataclass
class Verdict:
    threshold: float | None  # the bound on the value's side of the mean (None during warm-up)
    low: float | None
    high: float | None
    alarm: bool  # the alarm state after this value
    event: str | None  # "raised" or "cleared" when the state changed here
    status: str  # warmup | ok | beyond | alarm


@dataclass
class Ewma:
    direction: Direction
    k: float
    lam: float
    warmup: int
    confirm: int = 1
    clear: int = 4
    floor: float = 0.01
    sigma_min: float = 0.0  # e.g. the metric's spread over resampled reference windows
    n: int = 0
    mean: float = 0.0
    var: float = 0.0
    alarm: bool = False
    beyond: int = 0
    inside: int = 0
    base_low: float | None = None  # the warm-up envelope
    base_high: float | None = None

    def _envelope(self) -> tuple[float, float]:
        sigma = max(math.sqrt(max(self.var, 0.0)), self.floor * abs(self.mean), self.sigma_min, 1e-12)
        return self.mean - self.k * sigma, self.mean + self.k * sigma

    def bounds(self) -> tuple[float, float]:
        low, high = self._envelope()
        if self.base_low is not None and self.base_high is not None:
            low, high = max(low, self.base_low), min(high, self.base_high)
        return low, high

    def update(self, x: float) -> Verdict:
        if self.n < self.warmup:
            # Welford's running mean and variance over the warm-up values.
            self.n += 1
            d = x - self.mean
            self.mean += d / self.n
            self.var += (d * (x - self.mean) - self.var) / self.n
            if self.n == self.warmup:
                if self.warmup > 1:
                    self.var *= self.warmup / (self.warmup - 1)
                self.base_low, self.base_high = self._envelope()
            return Verdict(None, None, None, False, None, "warmup")
        low, high = self.bounds()
        out = (self.direction != "below" and x > high) or (self.direction != "above" and x < low)
        event = None
        if self.alarm:
            self.inside = 0 if out else self.inside + 1
            if self.inside >= self.clear:
                self.alarm, self.inside, self.beyond, event = False, 0, 0, "cleared"
        elif out:
            self.beyond += 1
            if self.beyond >= self.confirm:
                self.alarm, self.inside, event = True, 0, "raised"
        else:
            self.beyond = 0
            d = x - self.mean
            self.mean += self.lam * d
            self.var = (1 - self.lam) * (self.var + self.lam * d * d)
        threshold = low if (self.direction == "below" or (self.direction == "both" and x < self.mean)) else high
        status = "alarm" if self.alarm else ("beyond" if out else "ok")
        return Verdict(threshold, low, high, self.alarm, event, status)

    @classmethod
    def calibrated(
        cls,
        direction: Direction,
        k: float,
        lam: float,
        confirm: int,
        clear: int,
        floor: float,
        mean: float,
        sigma: float,
    ) -> Ewma:
        """No warm-up: the statistics start from a null distribution known beforehand (the metric over
        windows of the reference), whose envelope ``mean +- k sigma`` also bounds the band for good."""
        e = cls(direction, k, lam, 0, confirm, clear, floor, sigma_min=sigma, mean=mean, var=sigma * sigma)
        e.base_low, e.base_high = e._envelope()
        return e

    def state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Ewma:
        return cls(**state)
