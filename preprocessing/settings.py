"""Preprocessing settings, read from ``MMLAKE_PREPROCESS_...`` environment variables."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class PreprocessSettings(BaseSettings):
    """Settings of the preprocessing and backfill runs. Every field is bound to ``MMLAKE_PREPROCESS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_PREPROCESS_", extra="ignore", frozen=True)

    manifest: str | None = Field(
        None, description="Operator manifest (JSON); unset: the one shipped in `preprocessing/operators.json`.")
    cache_dir: str = Field(
        "~/.cache/mmlake/operators",
        description="Where generated encoder models (the CLIP towers) are written on first use.")
    clip_weights: str | None = Field(
        None, description="Local open_clip checkpoint for the image and text towers; unset: seeded, untrained.")
    clip_model: str = Field("ViT-S-32", description="open_clip architecture of the towers.")
    provider: Literal["auto", "cpu", "cuda"] = Field("auto", description="ONNX Runtime execution provider: auto, cpu or cuda (never a silent fallback).")
    threads: int = Field(0, ge=0, description="Intra-op threads per session; 0: min(CPU count, 8), fixed at start and recorded.")
    graph_optimization: Literal["disabled", "basic", "extended", "all"] = Field("all", description="ORT graph optimisation level: disabled, basic, extended or all.")
    batch_size: int = Field(32, gt=0, le=4096, description="Inputs per encoder call.")
    commit_rows: int = Field(1024, gt=0, description="Feature rows per Delta commit of an incremental run.")
    commit_retries: int = Field(20, ge=0, description="How often a run re-plans after losing a commit race to another writer.")

    def with_overrides(self, **overrides: Any) -> PreprocessSettings:
        values = {k: v for k, v in overrides.items() if v is not None}
        if not values:
            return self
        return type(self).model_validate({**self.model_dump(), **values})


class DriftSettings(BaseSettings):
    """Settings of the drift runs. Every field is bound to ``MMLAKE_DRIFT_<NAME>``. Changing one that
    decides a metric's value after the reference was fitted needs ``mmlake drift --rebuild``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_DRIFT_", extra="ignore", frozen=True)

    window: int = Field(128, ge=8, description="Samples per window.")
    step: int = Field(16, ge=1, description="Samples between the starts of consecutive windows.")
    reference: int = Field(1024, ge=32, description="Samples in the reference window (the first of the stream) the codebooks are fitted on.")
    codes: int = Field(16, ge=2, le=256, description="Codebook size per modality.")
    seed: int = Field(0, description="Seed of the codebook fit and of the resampled reference windows.")
    k: float = Field(7.0, gt=0, description="Thresholds lie k sigma from the EWMA mean.")
    ewma_lambda: float = Field(0.02, gt=0, lt=1, description="Weight of each new in-bounds value in the EWMA mean and variance.")
    warmup: int = Field(32, ge=2, description="Windows per metric that only estimate the mean and variance (no alarm).")
    confirm: int = Field(2, ge=1, description="Consecutive windows beyond a threshold that raise an alarm.")
    clear: int = Field(4, ge=1, description="Consecutive windows back inside that clear it.")
    min_valid: float = Field(0.5, gt=0, le=1, description="A metric is skipped in a window with fewer valid parts than this share of what the reference leads one to expect.")
    decay_windows: int = Field(8, ge=3, description="Windows of mutual-information history the decay rate is fitted over.")
    alpha: float = Field(0.5, gt=0, description="Pseudo-count added to every cell of the reference distributions (divergences).")

    def with_overrides(self, **overrides: Any) -> DriftSettings:
        values = {k: v for k, v in overrides.items() if v is not None}
        return self if not values else type(self).model_validate({**self.model_dump(), **values})

    def config(self) -> Any:
        from preprocessing.drift.detector import DriftConfig

        return DriftConfig(window=self.window, step=self.step, reference=self.reference, codes=self.codes,
                           seed=self.seed, k=self.k, ewma_lambda=self.ewma_lambda, warmup=self.warmup,
                           confirm=self.confirm, clear=self.clear, min_valid=self.min_valid,
                           decay_windows=self.decay_windows, alpha=self.alpha)
