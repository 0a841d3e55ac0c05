"""The wire format: event-time parsing, record ids, and one dead-letter reason per kind of bad record."""

from __future__ import annotations

import calendar

import pytest

from mmlake.ingest import wire
from mmlake.ingest.wire import Accepted, Reason, Rejected
from tests.fixtures.data import png, record_id, wav

MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z, from calendar below
LIMIT = 1024


def decode(value: bytes | None, headers: dict[str, bytes], key: bytes | None = None, limit: int = LIMIT):
    return wire.decode(key, value, list(headers.items()), max_payload_bytes=limit)


def test_epoch_of_the_test_constant() -> None:
    assert calendar.timegm((2026, 1, 1, 0, 0, 0)) * 1000 == MS


@pytest.mark.parametrize(
    ("text", "expected_us"),
    [
        (str(MS), MS * 1000),
        ("2026-01-01T00:00:00Z", MS * 1000),
        ("2026-01-01T02:00:00+02:00", MS * 1000),
        ("2025-12-31T19:00:00.250-05:00", MS * 1000 + 250_000),
        ("2026-01-01t00:00:00.000001z", MS * 1000 + 1),
    ],
)
def test_event_time_formats(text: str, expected_us: int) -> None:
    assert wire.parse_event_time(text) == expected_us


@pytest.mark.parametrize("text", ["", "yesterday", "2026-01-01T00:00:00", "2026-01-01", "12.5"])
def test_event_time_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        wire.parse_event_time(text)


def test_default_record_id_matches_the_documented_layout() -> None:
    got = decode(b"hello", {"mm-event-time": b"2026-01-01T00:00:00Z", "mm-modality": b"text"})
    assert isinstance(got, Accepted)
    assert got.record_id == record_id("text", MS * 1000, b"hello")
    # The same instant spelled as epoch milliseconds is the same record.
    again = decode(b"hello", {"mm-event-time": str(MS).encode(), "mm-modality": b"text"})
    assert again.record_id == got.record_id
    other = decode(b"hello", {"mm-event-time": str(MS + 1).encode(), "mm-modality": b"text"})
    assert other.record_id != got.record_id


def test_ids_and_content_types() -> None:
    base = {"mm-event-time": str(MS).encode(), "mm-modality": b"image"}
    got = decode(png(), base, key=b"sample-7")
    assert isinstance(got, Accepted)
    assert (got.sample_id, got.content_type, got.modality) == ("sample-7", "image/png", "image")
    explicit = decode(png(), {**base, "mm-record-id": b"r1", "mm-sample-id": b"s1"}, key=b"k")
    assert (explicit.record_id, explicit.sample_id) == ("r1", "s1")
    no_key = decode(png(), base)
    assert no_key.sample_id == no_key.record_id
    audio = decode(wav(), {"mm-event-time": str(MS).encode(), "mm-modality": b"audio"})
    assert isinstance(audio, Accepted) and audio.content_type == "audio/wav"


def test_float_wav_is_a_valid_container() -> None:
    # The encoding (IEEE float here) is the audio operator's concern, not ingest's.
    got = decode(wav(fmt_code=3, bits=32), {"mm-event-time": str(MS).encode(), "mm-modality": b"audio"})
    assert isinstance(got, Accepted)


def _truncated_wav() -> bytes:
    return wav(n_samples=400)[:-100]


@pytest.mark.parametrize(
    ("value", "headers", "reason"),
    [
        (b"x", {"mm-modality": b"text"}, Reason.MISSING_EVENT_TIME),
        (b"x", {"mm-event-time": b"soon", "mm-modality": b"text"}, Reason.BAD_EVENT_TIME),
        (b"x", {"mm-event-time": str(MS).encode()}, Reason.MISSING_MODALITY),
        (b"x", {"mm-event-time": str(MS).encode(), "mm-modality": b"video"}, Reason.UNKNOWN_MODALITY),
        (b"x", {"mm-event-time": b"\xff", "mm-modality": b"text"}, Reason.BAD_HEADER),
        (b"x" * (LIMIT + 1), {"mm-event-time": str(MS).encode(), "mm-modality": b"text"}, Reason.OVERSIZE),
        (
            b"x",
            {"mm-event-time": str(MS).encode(), "mm-modality": b"text", "content-type": b"image/png"},
            Reason.CONTENT_TYPE_MISMATCH,
        ),
        (png()[:40], {"mm-event-time": str(MS).encode(), "mm-modality": b"image"}, Reason.UNDECODABLE_IMAGE),
        (b"GIF89a-nope", {"mm-event-time": str(MS).encode(), "mm-modality": b"image"}, Reason.UNDECODABLE_IMAGE),
        (_truncated_wav(), {"mm-event-time": str(MS).encode(), "mm-modality": b"audio"}, Reason.UNDECODABLE_AUDIO),
        (b"ID3 mp3", {"mm-event-time": str(MS).encode(), "mm-modality": b"audio"}, Reason.UNDECODABLE_AUDIO),
        (b"caf\xe9", {"mm-event-time": str(MS).encode(), "mm-modality": b"text"}, Reason.INVALID_TEXT),
    ],
)
def test_each_bad_record_gets_its_reason(value: bytes, headers: dict[str, bytes], reason: Reason) -> None:
    got = decode(value, headers)
    assert isinstance(got, Rejected)
    assert got.reason is reason
    assert got.message and "\n" not in got.message


def test_payload_at_the_limit_is_accepted() -> None:
    got = decode(b"x" * LIMIT, {"mm-event-time": str(MS).encode(), "mm-modality": b"text"})
    assert isinstance(got, Accepted)


def test_empty_text_is_accepted_for_the_operators_to_judge() -> None:
    got = decode(b"", {"mm-event-time": str(MS).encode(), "mm-modality": b"text"})
    assert isinstance(got, Accepted)
