"""The outcomes of checking one Kafka record against the wire contract (see :mod:`mmlake.ingest.wire`):
plain named tuples, which the native module (:mod:`mmlake.ingest.native`) builds too."""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class Reason(str, Enum):
    """Why a record went to the dead-letter table. The value is stored in ``dlq.error_code``."""

    MISSING_VALUE = "missing_value"
    MISSING_EVENT_TIME = "missing_event_time"
    BAD_EVENT_TIME = "bad_event_time"
    EVENT_TIME_OUT_OF_RANGE = "event_time_out_of_range"
    EVENT_TIME_IN_FUTURE = "event_time_in_future"
    MISSING_MODALITY = "missing_modality"
    UNKNOWN_MODALITY = "unknown_modality"
    BAD_HEADER = "bad_header"
    CONTENT_TYPE_MISMATCH = "content_type_mismatch"
    OVERSIZE = "oversize_payload"
    UNDECODABLE_IMAGE = "undecodable_image"
    UNDECODABLE_AUDIO = "undecodable_audio"
    INVALID_TEXT = "invalid_text"
    #: Decided by the engine, not by the record alone:
    RECORD_ID_CONFLICT = "record_id_conflict"
    UNDECODABLE_RECORD = "undecodable_record"


class Accepted(NamedTuple):
    """A record that meets the contract. ``event_time_us`` is UTC epoch microseconds."""

    record_id: str
    sample_id: str
    modality: str
    content_type: str
    event_time_us: int
    payload_sha256: str


class Rejected(NamedTuple):
    """A record that breaks the contract, with a reason code and a one-line message."""

    reason: Reason
    message: str


class Checked(NamedTuple):
    """A record that meets the contract, before its digests: :func:`digest` makes it :class:`Accepted`.
    ``record_id`` and ``sample_id`` are the headers' (or the key's) when the record names them."""

    record_id: str | None
    sample_id: str | None
    modality: str
    content_type: str
    event_time_us: int
