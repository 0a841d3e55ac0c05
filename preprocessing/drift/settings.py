"""Drift settings, read from ``MMLAKE_DRIFT_...`` environment variables, and the choice of a reference.

The parameters of the detector are declared once, in :class:`DriftParameters`: the user-facing
:class:`DriftSettings` binds them to the environment, the detector's
:class:`~mmlake.preprocessing.drift.detector.DriftConfig` adds what users do not set.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import SettingsConfigDict

from mmlake.errors import InputError
from mmlake.lake import time_range
from mmlake.settings import Settings


class DriftParameters(BaseModel):
    """What decides how drift is measured: windows, reference, codebooks, thresholds."""

    model_config = ConfigDict(frozen=True)

    window: int = Field(128, ge=8, description="Samples per window.")
    step: int = Field(16, ge=1, description="Samples between the starts of consecutive windows.")
    reference: int = Field(
        1024,
        ge=32,
        description="Samples in the reference window (the first of the stream) the codebooks are fitted on.",
    )
    codes: int = Field(16, ge=2, le=256, description="Codebook size per modality.")
    seed: int = Field(0, description="Seed of the codebook fit and of the resampled reference windows.")
    k: float = Field(7.0, gt=0, description="Thresholds lie k sigma from the EWMA mean.")
    ewma_lambda: float = Field(
        0.02, gt=0, lt=1, description="Weight of each new in-bounds value in the EWMA mean and variance."
    )
    warmup: int = Field(
        0,
        ge=0,
        description=(
            "0 (the default): every threshold is calibrated on the reference, and the first window after it can "
            "raise an alarm. N > 0: the first N windows per metric only estimate the mean and variance (no alarm), "
            "as earlier releases did; a drift that starts within them is learnt as normal."
        ),
    )
    confirm: int = Field(2, ge=1, description="Consecutive windows beyond a threshold that raise an alarm.")
    clear: int = Field(4, ge=1, description="Consecutive windows back inside that clear it.")
    min_valid: float = Field(
        0.5,
        gt=0,
        le=1,
        description=(
            "A metric is skipped in a window with fewer valid parts than this share of what the reference leads "
            "one to expect."
        ),
    )
    decay_windows: int = Field(
        8, ge=3, description="Windows of mutual-information history the decay rate is fitted over."
    )
    alpha: float = Field(
        0.5, gt=0, description="Pseudo-count added to every cell of the reference distributions (divergences)."
    )


class DriftSettings(Settings, DriftParameters):
    """Settings of the drift runs. Every field is bound to ``MMLAKE_DRIFT_<NAME>``. Changing one that
    decides a metric's value after the reference was fitted needs ``mmlake drift --rebuild``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_DRIFT_")


class ReferenceRange(BaseModel):
    """Which samples the drift reference is fitted on: those with ``start <= event time < end`` (RFC 3339
    or epoch ms; both or neither), or with ``first`` the stream's first ``reference`` samples again.
    Neither: a new stream's first samples, or the reference the codebooks were fitted on."""

    model_config = ConfigDict(frozen=True)

    start: str | None = Field(None, description="First event time of the reference range (inclusive).")
    end: str | None = Field(None, description="End of the reference range (exclusive).")
    first: bool = Field(False, description="Back to the stream's first samples.")

    def bounds_us(self) -> tuple[int, int] | None:
        """The range ``[start, end)`` as epoch µs, None without one; a one-line :class:`InputError` for
        half a range, an empty one, or a range together with ``first``."""
        if self.start is None and self.end is None:
            return None
        if self.start is None or self.end is None:
            raise InputError("a reference range needs both --reference-from and --reference-to")
        if self.first:
            raise InputError("choose a reference range or the stream's first samples, not both")
        return time_range(self.start, self.end, requirement="--reference-from must be before --reference-to")

    @property
    def moves(self) -> bool:
        """Whether this asks for another reference than the one the codebooks were fitted on."""
        return self.first or self.start is not None or self.end is not None
