"""User-facing ingest settings, read from ``MMLAKE_...`` environment variables.

The CLI and the Prefect flows build the same :class:`IngestSettings`; explicit arguments override the
environment, which overrides the defaults.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from mmlake.settings import LakeSettings

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"


class IngestSettings(LakeSettings):
    """Settings of Kafka-to-Delta ingest (and the lake it writes). Every field is bound to
    ``MMLAKE_<FIELD NAME>``."""

    kafka_bootstrap: str = Field(
        DEFAULT_BOOTSTRAP,
        description="Kafka bootstrap servers, comma separated (`mmlake broker` listens here by default).",
    )
    kafka_client: Literal["kafka-python", "confluent-kafka"] = Field(
        "confluent-kafka",
        description="The Kafka client ingest reads with: `confluent-kafka` (librdkafka: fetching and decoding in "
        "C threads; the faster on both workloads of `make bench`) or `kafka-python` (pure Python). Same records, "
        "same tables.",
    )
    kafka_timeout_s: float = Field(
        10.0,
        gt=0,
        description="How long to wait for the broker before failing with a one-line error, seconds.",
    )
    allowed_lateness_s: float = Field(
        600.0,
        ge=0,
        description="Watermark = max event time seen minus this; records behind it go to `late`.",
    )
    max_future_skew: float = Field(
        86_400.0,
        ge=0,
        description=(
            "Seconds an event time may lie ahead of the record's Kafka timestamp (or, without one, of "
            "its partition's newest event time); further ahead it is dead-lettered as event_time_in_future "
            "and does not move the watermark."
        ),
    )
    max_payload_bytes: int = Field(
        16 * 1024 * 1024,
        gt=0,
        description="Payloads larger than this go to the dead-letter table.",
    )
    batch_max_records: int = Field(
        5000, gt=0, description="Most records in one micro-batch (one Delta commit per table)."
    )
    batch_max_bytes: int = Field(
        64 * 1024 * 1024, gt=0, le=1024**3, description="Most payload bytes in one micro-batch."
    )
    side_table_lag_records: int = Field(
        50_000,
        ge=0,
        description=(
            "How far (in offsets) the late and dlq tables' stored offsets may trail raw's before an "
            "offsets-only commit is made for them; a killed run re-reads at most this much."
        ),
    )
    commit_retries: int = Field(
        20, ge=0, description="How often a micro-batch is re-planned after losing a commit race."
    )
    idle_timeout_s: float = Field(
        1.0,
        gt=0,
        description="In --follow mode, how long to wait for new records before committing what is buffered.",
    )
