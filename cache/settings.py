"""User-facing SafeCache settings, read from ``MMLAKE_CACHE_...`` environment variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict

from mmlake.settings import Settings


class CacheSettings(Settings):
    """Settings of SafeCache (in-process and server). Every field is bound to ``MMLAKE_CACHE_<NAME>``."""

    model_config = SettingsConfigDict(env_prefix="MMLAKE_CACHE_")

    min_similarity: float = Field(
        0.9, gt=0, le=1, description="Server floor: a lookup hits only at cosine >= this; requests may only raise it."
    )
    refresh_similarity: float = Field(
        0.995,
        gt=0,
        le=1,
        description="A store this close to an existing entry refreshes that entry instead of adding one.",
    )
    lsh_bits: int = Field(13, ge=1, le=62, description="Hyperplanes per LSH table (bits of a bucket key).")
    lsh_tables: int = Field(12, ge=1, le=64, description="Independent LSH tables; a candidate from any table counts.")
    lsh_probes: int = Field(
        2,
        ge=0,
        le=8,
        description="Multi-probe: also look in the buckets one bit-flip away, for this many low-margin bits.",
    )
    lsh_seed: int = Field(
        20260101, description="Seed of the hyperplanes; stored with snapshots and checked on restore."
    )
    collision_bound: float = Field(
        0.05, ge=0, le=1, description="A bucket whose rate of dissimilar collisions exceeds this stops admitting."
    )
    collision_min_pairs: int = Field(
        20, ge=1, description="Pairs a bucket must have seen before its collision rate can close it."
    )
    ttl_s: float = Field(120.0, gt=0, description="Default time to live of an entry, seconds (per-entry override).")
    max_ttl_s: float = Field(86_400.0, gt=0, description="Largest per-entry TTL a client may ask for, seconds.")
    gpu_bytes: int = Field(
        4 << 30, ge=0, description="Byte budget of the GPU tier, used only where torch sees a GPU (0: no GPU tier)."
    )
    cpu_bytes: int = Field(1 << 30, ge=0, description="Byte budget of the CPU tier.")
    disk_bytes: int = Field(0, ge=0, description="Byte budget of the disk spill tier (0: evict instead of spilling).")
    disk_dir: str | None = Field(None, description="Folder of the disk tier (safetensors files).")
    max_entry_bytes: int = Field(256 << 20, gt=0, description="Largest KV payload one entry may hold.")
    max_body_bytes: int = Field(300 << 20, gt=0, description="Largest HTTP request body; larger ones get 413.")
    max_embedding_dim: int = Field(8192, gt=0, description="Largest embedding dimension accepted.")
    max_models_per_tenant: int = Field(
        256,
        ge=1,
        description="Most namespaces (model id x salt) one tenant may hold entries under; each costs index memory.",
    )
    fair_shares: bool = Field(
        True, description="Evict from tenants over their share of a tier first (off: one LRU-K order for all tenants)."
    )
    max_inflight_bytes: int = Field(
        1 << 30,
        gt=0,
        description="Most request-body bytes the server holds at once; beyond them: 503 with Retry-After.",
    )
    body_timeout_s: float = Field(
        10.0, gt=0, description="Longest a request body may take to arrive; after it: 408 and the connection closed."
    )
    max_json_depth: int = Field(8, ge=2, description="Deepest nesting a JSON request body may have.")
    docs: bool = Field(
        False, description="Serve the interactive API docs at /docs and /redoc (the schema is always at /openapi.json)."
    )
    similarity_weight_s: float = Field(
        60.0, ge=0, description="Eviction: an entry reused at similarity s ages (1 - s) x this many seconds faster."
    )
