"""The native fast path of the wire contract (ingest/_native.c) against the Python rules it stands in for.

The native module only recognises records the Python rules accept and computes what they would; every
other record goes back to Python. So for any record, ``check`` + ``digest`` must give the same result with
the module as without it, and the module must actually take the plain records (else it is dead weight).
"""

from __future__ import annotations

import hashlib
import itertools
import random

import pytest

from mmlake.ingest import native as native_path
from mmlake.ingest import wire

native = native_path.module
pytestmark = pytest.mark.skipif(
    native is None,
    reason="the native module was not built here (no C compiler or libcrypto at install time): Python does it all",
)

TIME = b"1767225600000"


def _python(key, value, headers, limit, not_after, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(native_path, "module", None)
        result = wire.check(key, value, headers, max_payload_bytes=limit, not_after_us=not_after)
        if isinstance(result, wire.Checked):
            return result, wire.digest([result], [value])[0]
        return result, None


def _native(key, value, headers, limit, not_after):
    result = wire.check(key, value, headers, max_payload_bytes=limit, not_after_us=not_after)
    if isinstance(result, wire.Checked):
        return result, wire.digest([result], [value])[0]
    return result, None


def _utf8_valid(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


# Byte strings around every boundary of UTF-8: overlong forms, surrogates, the top of Unicode, truncation.
_EDGES = [
    b"",
    b"a",
    b"\x7f",
    b"\x80",
    b"\xc0\x80",
    b"\xc1\xbf",
    b"\xc2\x80",
    b"\xdf\xbf",
    b"\xe0\x80\x80",
    b"\xe0\x9f\xbf",
    b"\xe0\xa0\x80",
    b"\xed\x9f\xbf",
    b"\xed\xa0\x80",
    b"\xed\xbf\xbf",
    b"\xee\x80\x80",
    b"\xef\xbf\xbf",
    b"\xf0\x8f\xbf\xbf",
    b"\xf0\x90\x80\x80",
    b"\xf4\x8f\xbf\xbf",
    b"\xf4\x90\x80\x80",
    b"\xf5\x80\x80\x80",
    b"\xff",
    b"\xe2\x82",
    b"\xf0\x9f\x98",
    b"\xc3",
    "é€😀".encode(),
]


def test_the_native_utf8_check_agrees_with_python_on_every_edge_and_on_random_bytes() -> None:
    rng = random.Random(7)
    samples = [a + b for a, b in itertools.product(_EDGES, repeat=2)]
    samples += [
        bytes(rng.choice([rng.randrange(256), rng.randrange(0x80, 0x100), 0x41]) for _ in range(rng.randrange(1, 40)))
        for _ in range(20_000)
    ]
    samples += [b"x" * rng.randrange(0, 20) + s + b"y" * rng.randrange(0, 20) for s in _EDGES]  # past the 8-byte stride
    # Valid text of every width (surrogates cannot be encoded: skipped), and the same cut short by a byte.
    points = [
        rng.choice(
            [
                rng.randrange(0x80),
                rng.randrange(0x80, 0x800),
                rng.randrange(0x800, 0xD800),
                rng.randrange(0xE000, 0x10000),
                rng.randrange(0x10000, 0x110000),
            ]
        )
        for _ in range(40_000)
    ]
    texts = ["".join(map(chr, points[i : i + 20])).encode() for i in range(0, len(points), 20)]
    samples += texts + [t[:-1] for t in texts]
    headers = [("mm-event-time", TIME), ("mm-modality", b"text")]
    taken = 0
    for payload in samples:
        got = native.check_text(None, payload, headers, 1 << 20, None)
        assert (got is not None) == _utf8_valid(payload), payload
        taken += got is not None
    assert taken > 2000


def _random_record(rng: random.Random):
    if rng.random() < 0.4:  # a plain text record, as producers send them (the native path's share)
        headers = [("mm-event-time", str(rng.randrange(10**13)).encode()), ("mm-modality", b"text")]
        headers += rng.sample(
            [("mm-sample-id", b"s1"), ("mm-record-id", "ré".encode()), ("content-type", b"Text/x"), ("x-trace", b"t")],
            rng.randrange(0, 3),
        )
        return (
            rng.choice([None, b"k", b""]),
            rng.choice([b"hi", "naïve €".encode(), b""]),
            headers,
            1 << 20,
            rng.choice([None, 10**16]),
        )
    names = [
        "mm-event-time",
        "MM-Event-Time",
        "mm-modality",
        "Mm-Modality",
        "content-type",
        "Content-Type",
        "mm-record-id",
        "mm-sample-id",
        "MM-SAMPLE-ID",
        "x-other",
        "mm-évent-time",
        "mm-event-time\u212a",
    ]
    values = {
        "time": [
            TIME,
            b"0",
            b"9999999999999",
            b"99999999999999",
            b"-5",
            b"",
            b"17x",
            b"\xff",
            b"2026-01-01T00:00:00Z",
            b"2026-01-01T00:00:00.5+01:00",
            "１２".encode(),
            b"0001767225600000",
        ],
        "modality": [b"text", b"TEXT", b"image", b"", b"text ", b"\xff"],
        "ctype": [
            b"text/plain",
            b"TEXT/x",
            b"text",
            b"",
            b"image/png",
            "tëxt/".encode(),
            b"text/\xff",
            b"TeXt/markdown",
        ],
        "id": [b"r1", b"", "ré".encode(), b"\xff", b"s" * 80],
        "other": [b"v", b"\xff\xfe", b"", None],
    }
    kind = {
        "mm-event-time": "time",
        "MM-Event-Time": "time",
        "mm-modality": "modality",
        "Mm-Modality": "modality",
        "content-type": "ctype",
        "Content-Type": "ctype",
        "mm-record-id": "id",
        "mm-sample-id": "id",
        "MM-SAMPLE-ID": "id",
    }
    headers = [("mm-event-time", TIME), ("mm-modality", b"text")] if rng.random() < 0.7 else []
    for _ in range(rng.randrange(0, 5)):
        name = rng.choice(names)
        pool = values[kind.get(name, "other")]
        headers.append((name, rng.choice(pool + [None] if rng.random() < 0.1 else pool)))
    if rng.random() < 0.3:
        rng.shuffle(headers)
    key = rng.choice([None, b"k1", b"", b"\xff", "ké".encode()])
    value = rng.choice([b"hello", b"", "naïve".encode(), b"\xed\xa0\x80", b"a" * 300, None, b"\x89PNG\r\n\x1a\n"])
    limit = rng.choice([1 << 20, 4, 0, 10**30])
    not_after = rng.choice([None, 1767225600000 * 1000, 1767225600000 * 1000 - 1, -1, 10**30, -(10**30)])
    return key, value, headers, limit, not_after


def test_check_and_digest_give_the_same_with_the_native_module_as_without(monkeypatch) -> None:
    rng = random.Random(11)
    fast = 0
    for _ in range(6000):
        key, value, headers, limit, not_after = _random_record(rng)
        expected = _python(key, value, headers, limit, not_after, monkeypatch)
        assert _native(key, value, headers, limit, not_after) == expected, (key, value, headers, limit, not_after)
        if isinstance(limit, int) and limit < 1 << 62:
            fast += native.check_text(key, value, headers, limit, not_after) is not None
    assert fast > 1500  # the plain records took the native path


def test_a_batch_digest_matches_hashlib_for_named_and_default_ids() -> None:
    rng = random.Random(3)
    checked, payloads = [], []
    for i in range(500):
        payload = rng.randbytes(rng.choice([0, 1, 63, 64, 65, 1024, 5000]))
        modality = rng.choice(["text", "image", "audio"])
        t = rng.choice([0, -62_135_596_800_000_000, 253_402_300_799_999_999, 1767225600000000 + i])
        named = rng.choice([None, f"rid-{i}"])
        checked.append(wire.Checked(named, rng.choice([None, f"s{i}"]), modality, "x/y", t))
        payloads.append(payload)
    got = wire.digest(checked, payloads)
    for c, payload, acc in zip(checked, payloads, got, strict=True):
        rid = c.record_id or hashlib.sha256(f"{c.modality}\0{c.event_time_us}\0".encode() + payload).hexdigest()
        assert acc == wire.Accepted(
            rid, c.sample_id or rid, c.modality, "x/y", c.event_time_us, hashlib.sha256(payload).hexdigest()
        )
        assert type(acc) is wire.Accepted
    assert wire.digest([], []) == []
    # A batch over 4 MB is hashed by two threads: the same digests, in the same order.
    big = [rng.randbytes(rng.choice([1, 100_000, 300_000])) for _ in range(60)]
    named = [wire.Checked(rng.choice([None, f"id{i}"]), None, "image", "image/png", i) for i in range(60)]
    assert sum(map(len, big)) > 4 << 20
    assert wire.digest(named, big) == wire._digest_py(named, big)
    with pytest.raises(ValueError):
        native.accept_many(checked[:2], payloads[:1])
    with pytest.raises(TypeError):
        native.accept_many([("a", "b")], [b"x"])


def test_payload_columns_are_the_same_gathered_natively_and_in_python(monkeypatch) -> None:
    from mmlake.ingest.rows import binary_array as _binary_array

    rng = random.Random(5)
    values = [rng.randbytes(rng.choice([0, 1, 7, 1024, 100_000])) for _ in range(300)]
    fast = _binary_array(values)
    with monkeypatch.context() as m:
        m.setattr(native_path, "module", None)
        slow = _binary_array(values)
    assert fast.equals(slow) and fast.to_pylist() == values
    assert _binary_array([]).to_pylist() == []
    import pyarrow as pa

    with pytest.raises(ValueError):
        native.gather([b"abc"], pa.allocate_buffer(2))


def test_header_checks_agree_with_python(monkeypatch) -> None:
    from mmlake.ingest import recovery

    class Message:
        def __init__(self, headers):
            self._headers = headers

        def headers(self):
            return self._headers

    cases = [
        [],
        [("a", b"1")],
        [("a", None), ("b", b"")],
        [("a", b"1", b"2")],
        [("a",)],
        [["a", b"1"]],
        [(b"a", b"1")],
        [(1, b"1")],
        [("\udcff", b"1")],
        [("ké", b"1"), ("x", b"2")],
        [("a", b"1"), ("\ud800", b"")],
    ]
    for headers in cases:
        fast = recovery._headers(Message(headers))
        with monkeypatch.context() as m:
            m.setattr(native_path, "module", None)
            slow = recovery._headers(Message(headers))
        assert fast == slow, headers
    assert recovery._headers(Message([("a", b"1")])) == [("a", b"1")]
    assert recovery._headers(Message([("\udcff", b"1")])) is None


def test_a_native_build_older_than_the_code_is_not_used(monkeypatch) -> None:
    monkeypatch.setattr(native, "API", native_path.NATIVE_API - 1)
    with pytest.warns(RuntimeWarning, match="not used"):
        assert native_path.load() is None
    monkeypatch.setattr(native, "API", native_path.NATIVE_API)
    assert native_path.load() is native
