"""The Kafka wire format: one record is one part (image, audio or text) of a multimodal sample.

:func:`decode` turns a consumed record into either an :class:`Accepted` part or a :class:`Rejected`
one that carries a reason code and a one-line message. It never raises on bad input.
"""

from __future__ import annotations

import hashlib
import io
import re
import struct
import sys
from collections.abc import Sequence

from mmlake.ingest import native
from mmlake.ingest.records import Accepted, Checked, Reason, Rejected
from mmlake.lake import EventTimeOutOfRange, format_us, parse_event_time

__all__ = ["Accepted", "Checked", "Headers", "Reason", "Rejected", "check", "decode", "default_record_id", "digest"]

HEADER_EVENT_TIME = "mm-event-time"
HEADER_MODALITY = "mm-modality"
HEADER_CONTENT_TYPE = "content-type"
HEADER_RECORD_ID = "mm-record-id"
HEADER_SAMPLE_ID = "mm-sample-id"

MODALITIES = ("image", "audio", "text")

Headers = Sequence[tuple[str, bytes | None]]


def default_record_id(modality: str, event_time_us: int, payload: bytes) -> str:
    """The de-duplication id when ``mm-record-id`` is absent.

    Hex SHA-256 of ``modality``, NUL, the event time as decimal UTC epoch microseconds, NUL, then the
    payload bytes. Two spellings of one instant (RFC 3339 or epoch ms) give the same id.
    """
    digest = hashlib.sha256(b"%b\x00%d\x00" % (modality.encode(), event_time_us))
    digest.update(payload)
    return digest.hexdigest()


def sniff_content_type(modality: str, payload: bytes) -> str | None:
    """The MIME type the payload's leading bytes announce, or None where they announce nothing."""
    if modality == "text":
        return "text/plain; charset=utf-8"
    if payload.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if payload.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if payload[:4] == b"RIFF" and payload[8:12] == b"WAVE":
        return "audio/wav"
    return None


def _header_map(headers: Headers) -> dict[str, bytes]:
    # The last value of a repeated header wins, as most Kafka clients read them; a null value is absent.
    out: dict[str, bytes] = {}
    for key, value in headers:
        if value is None:
            out.pop(key.lower(), None)
        else:
            out[key.lower()] = value
    return out


def _check_image(payload: bytes) -> str | None:
    from PIL import Image

    try:
        with Image.open(io.BytesIO(payload)) as img:
            img.verify()
    except Exception as err:  # Pillow raises many types for bad bytes
        # Without the "<_io.BytesIO object at 0x...>" Pillow names: the same bytes, the same message.
        return _OBJECT_AT.sub("", f"{type(err).__name__}: {err}".splitlines()[0]).rstrip()
    return None


_OBJECT_AT = re.compile(r" ?<[^<>]* object at 0x[0-9a-fA-F]+>")


def _check_wav(payload: bytes) -> str | None:
    """Check the RIFF/WAVE container: a ``fmt `` chunk and a complete ``data`` chunk.

    The sample encoding is not judged here (PCM, float, ...): that is the audio operator's business.
    """
    if len(payload) < 12 or payload[:4] != b"RIFF" or payload[8:12] != b"WAVE":
        return "not a RIFF/WAVE file"
    pos, fmt_seen = 12, False
    while pos + 8 <= len(payload):
        chunk_id = payload[pos : pos + 4]
        size = struct.unpack_from("<I", payload, pos + 4)[0]
        body = pos + 8
        if chunk_id == b"fmt ":
            if size < 16 or body + size > len(payload):
                return "fmt chunk is short"
            channels, rate = struct.unpack_from("<HI", payload, body + 2)
            if channels == 0 or rate == 0:
                return "fmt chunk declares zero channels or a zero sample rate"
            fmt_seen = True
        elif chunk_id == b"data":
            if not fmt_seen:
                return "data chunk before the fmt chunk"
            if body + size > len(payload):
                return f"truncated: data chunk declares {size} bytes, {len(payload) - body} present"
            return None
        pos = body + size + (size & 1)  # chunks are padded to an even length
    return "no data chunk"


def _check_text(payload: bytes) -> str | None:
    try:
        payload.decode("utf-8", errors="strict")
    except UnicodeDecodeError as err:
        return f"not UTF-8 at byte {err.start}"
    return None


_PAYLOAD_CHECKS = {
    "image": (_check_image, Reason.UNDECODABLE_IMAGE),
    "audio": (_check_wav, Reason.UNDECODABLE_AUDIO),
    "text": (_check_text, Reason.INVALID_TEXT),
}


def decode(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    *,
    max_payload_bytes: int,
    not_after_us: int | None = None,
) -> Accepted | Rejected:
    """Check one record against the wire contract. Never raises on bad input.

    ``not_after_us``: the latest event time accepted (the future-time guard: the engine passes the
    record's Kafka timestamp plus the allowed skew); None: no bound but the supported range.
    """
    result = check(key, value, headers, max_payload_bytes=max_payload_bytes, not_after_us=not_after_us)
    if isinstance(result, Rejected):
        return result
    assert value is not None  # a checked record has a value
    return digest([result], [value])[0]


def check(
    key: bytes | None,
    value: bytes | None,
    headers: Headers,
    *,
    max_payload_bytes: int,
    not_after_us: int | None = None,
) -> Checked | Rejected:
    """:func:`decode` without the digests: the engine hashes the accepted records of a batch at once
    (:func:`digest`). A plain text record is recognised by the native module where it was built
    (``ingest/_native.c``: it accepts only what the rules below accept, and computes what they would);
    every other record, and every record without it, is judged here, rule by rule."""
    fast = native.module
    if fast is not None:
        plain = fast.check_text(key, value, headers, min(max_payload_bytes, sys.maxsize), not_after_us)
        if plain is not None:
            return plain
    if value is None:
        return Rejected(Reason.MISSING_VALUE, "the record has no value (a tombstone)")
    payload = value
    fields = _decoded_headers(headers)
    if fields is None:
        return Rejected(Reason.BAD_HEADER, "a header value is not UTF-8")
    if key is not None:
        try:
            key_text: str | None = key.decode("utf-8")
        except UnicodeDecodeError:
            return Rejected(Reason.BAD_HEADER, "the record key is not UTF-8")
    else:
        key_text = None

    raw_time = fields.get(HEADER_EVENT_TIME)
    if raw_time is None:
        return Rejected(Reason.MISSING_EVENT_TIME, f"header {HEADER_EVENT_TIME} is missing")
    try:
        event_time_us = parse_event_time(raw_time)
    except EventTimeOutOfRange as err:
        return Rejected(Reason.EVENT_TIME_OUT_OF_RANGE, f"header {HEADER_EVENT_TIME}: {err}")
    except ValueError as err:
        return Rejected(Reason.BAD_EVENT_TIME, f"header {HEADER_EVENT_TIME} is unusable: {err}")
    if not_after_us is not None and event_time_us > not_after_us:
        return Rejected(
            Reason.EVENT_TIME_IN_FUTURE,
            f"event time {format_us(event_time_us)} is beyond {format_us(not_after_us)}, the latest "
            "the future-time guard allows for this record (MMLAKE_MAX_FUTURE_SKEW)",
        )

    modality = fields.get(HEADER_MODALITY)
    if modality is None:
        return Rejected(Reason.MISSING_MODALITY, f"header {HEADER_MODALITY} is missing")
    if modality not in MODALITIES:
        return Rejected(
            Reason.UNKNOWN_MODALITY,
            f"modality {modality!r} is not one of {', '.join(MODALITIES)}",
        )

    if len(payload) > max_payload_bytes:
        return Rejected(
            Reason.OVERSIZE,
            f"payload of {len(payload)} bytes exceeds the maximum of {max_payload_bytes}",
        )

    declared = fields.get(HEADER_CONTENT_TYPE)
    if declared is not None and not declared.lower().startswith(modality + "/"):
        return Rejected(
            Reason.CONTENT_TYPE_MISMATCH,
            f"content-type {declared!r} does not fit modality {modality!r}",
        )

    check_payload, reason = _PAYLOAD_CHECKS[modality]
    problem = check_payload(payload)
    if problem is not None:
        return Rejected(reason, f"{modality} payload does not decode: {problem}")

    content_type = declared or sniff_content_type(modality, payload) or "application/octet-stream"
    return Checked(
        fields.get(HEADER_RECORD_ID) or None,
        fields.get(HEADER_SAMPLE_ID) or key_text or None,
        modality,
        content_type,
        event_time_us,
    )


def _decoded_headers(headers: Headers) -> dict[str, str] | None:
    """The headers by lower-case name, values decoded; None when a value that counts is not UTF-8."""
    out: dict[str, str] = {}
    try:
        for name, raw in _header_map(headers).items():
            out[name] = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
    return out


def digest(checked: Sequence[Checked], payloads: Sequence[bytes]) -> list[Accepted]:
    """The checked records with their digests: each payload's SHA-256 and, where the record names no
    ``mm-record-id``, :func:`default_record_id`. One call per batch: the native module (where it was
    built, see ``ingest/_native.c``) hashes the whole batch without the GIL."""
    fast = native.module
    if fast is not None:
        return fast.accept_many(checked, payloads)
    return _digest_py(checked, payloads)


def _digest_py(checked: Sequence[Checked], payloads: Sequence[bytes]) -> list[Accepted]:
    out = []
    for c, payload in zip(checked, payloads, strict=True):
        record_id = c.record_id or default_record_id(c.modality, c.event_time_us, payload)
        out.append(
            Accepted(
                record_id,
                c.sample_id or record_id,
                c.modality,
                c.content_type,
                c.event_time_us,
                hashlib.sha256(payload).hexdigest(),
            )
        )
    return out
