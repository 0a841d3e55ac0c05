"""Preprocessing settings, read from ``MMLAKE_PREPROCESS_...`` environment variables."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mmlake.settings import Settings


class PreprocessSettings(Settings):
    """Settings of the preprocessing and backfill runs. Every field is bound to ``MMLAKE_PREPROCESS_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_PREPROCESS_")

    manifest: str | None = Field(
        None, description="Operator manifest (JSON); unset: the one shipped in `preprocessing/operators.json`."
    )
    cache_dir: str = Field(
        "~/.cache/mmlake/operators",
        description="Where generated encoder models (EfficientNet-Lite0, the CLIP towers) are written on first use.",
    )
    clip_weights: str | None = Field(
        None,
        description="Local open_clip checkpoint: CLIP becomes the image and text operator; unset: images use the "
        "trained EfficientNet-Lite0, text a seeded (untrained) CLIP tower.",
    )
    clip_model: str = Field("ViT-S-32", description="open_clip architecture of the towers.")
    provider: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="ONNX Runtime execution provider: auto, cpu or cuda (never a silent fallback)."
    )
    threads: int = Field(
        0, ge=0, description="Intra-op threads per session; 0: min(CPU count, 8), fixed at start and recorded."
    )
    graph_optimization: Literal["disabled", "basic", "extended", "all"] = Field(
        "all", description="ORT graph optimisation level: disabled, basic, extended or all."
    )
    batch_size: int = Field(32, gt=0, le=4096, description="Inputs per encoder call.")
    commit_rows: int = Field(1024, gt=0, description="Feature rows per Delta commit of an incremental run.")
    commit_retries: int = Field(
        20, ge=0, description="How often a run re-plans after losing a commit race to another writer."
    )
