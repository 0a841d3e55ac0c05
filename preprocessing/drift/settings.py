"""Drift settings, read from ``MMLAKE_DRIFT_...`` environment variables."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mmlake.settings import Settings

if TYPE_CHECKING:
    from mmlake.preprocessing.drift.detector import DriftConfig


class DriftSettings(Settings):
    """Settings of the drift runs. Every field is bound to ``MMLAKE_DRIFT_<NAME>``. Changing one that
    decides a metric's value after the reference was fitted needs ``mmlake drift --rebuild``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_DRIFT_")

    window: int = Field(128, ge=8, description="Samples per window.")
    step: int = Field(16, ge=1, description="Samples between the starts of consecutive windows.")
    reference: int = Field(1024, ge=32, description="Samples in the reference window (the first of the stream) the codebooks are fitted on.")
    codes: int = Field(16, ge=2, le=256, description="Codebook size per modality.")
    seed: int = Field(0, description="Seed of the codebook fit and of the resampled reference windows.")
    k: float = Field(7.0, gt=0, description="Thresholds lie k sigma from the EWMA mean.")
    ewma_lambda: float = Field(0.02, gt=0, lt=1, description="Weight of each new in-bounds value in the EWMA mean and variance.")
    warmup: int = Field(0, ge=0, description="0 (the default): every threshold is calibrated on the reference, and the first window after it can raise an alarm. N > 0: the first N windows per metric only estimate the mean and variance (no alarm), as earlier releases did; a drift that starts within them is learnt as normal.")
    confirm: int = Field(2, ge=1, description="Consecutive windows beyond a threshold that raise an alarm.")
    clear: int = Field(4, ge=1, description="Consecutive windows back inside that clear it.")
    min_valid: float = Field(0.5, gt=0, le=1, description="A metric is skipped in a window with fewer valid parts than this share of what the reference leads one to expect.")
    decay_windows: int = Field(8, ge=3, description="Windows of mutual-information history the decay rate is fitted over.")
    alpha: float = Field(0.5, gt=0, description="Pseudo-count added to every cell of the reference distributions (divergences).")

    def config(self) -> DriftConfig:
        """The detector's configuration: these settings, field for field."""
        from mmlake.preprocessing.drift.detector import DriftConfig

        return DriftConfig(**self.model_dump())
