"""The ordered reader and compaction, over tables written by the engine from the real broker."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from deltalake import DeltaTable

from mmlake.errors import InputError
from mmlake.ingest import compact, read_stream, read_table, run_ingest
from mmlake.lake import offset_app_id
from tests.fixtures.data import table_rows
from tests.fixtures.streams import T0_MS

HOUR_MS = 3_600_000


@pytest.fixture
def scattered(producer, new_topic, settings):
    """60 records over ~3 days, arriving shuffled across 3 partitions and 3 runs."""
    topic = new_topic(partitions=3)
    rng = random.Random(7)
    times = [T0_MS + rng.randrange(0, 70 * HOUR_MS) for _ in range(60)]
    order = list(range(60))
    rng.shuffle(order)
    cfg = settings.with_overrides(allowed_lateness_s=100 * 3600)  # nothing late here
    for chunk in (order[:20], order[20:45], order[45:]):
        for i in chunk:
            producer.send(topic, f"r{i}".encode(), "text", event_time=times[i], partition=i % 3)
        producer.flush()
        run_ingest(topic, "s", cfg)
    return cfg, times, topic


def _key(row: dict) -> tuple:
    return (row["event_time"], row["kafka_partition"], row["kafka_offset"])


def test_reader_returns_event_time_order(scattered) -> None:
    cfg, times, _ = scattered
    rows = read_table(cfg.lake, "s", window=timedelta(hours=5))
    assert rows.num_rows == 60
    keys = [_key(r) for r in rows.to_pylist()]
    assert keys == sorted(keys)
    expected = sorted(datetime.fromtimestamp(t / 1000, tz=UTC) for t in times)
    assert [r["event_time"] for r in rows.to_pylist()] == expected


def test_reader_range_is_half_open(scattered) -> None:
    cfg, times, _ = scattered
    ordered = sorted(times)
    start, end = ordered[10], ordered[40]
    got = read_table(cfg.lake, "s", start=str(start), end=str(end), columns=["event_time", "payload"])
    assert got.column_names == ["event_time", "payload"]
    want = [t for t in ordered if start <= t < end]
    assert [int(ts.timestamp() * 1000) for ts in got.column("event_time").to_pylist()] == want
    assert read_table(cfg.lake, "s", start=str(end), end=str(end)).num_rows == 0


def test_reader_bad_requests(scattered, tmp_path) -> None:
    cfg, _, _ = scattered
    with pytest.raises(InputError, match="no raw table"):
        list(read_stream(str(tmp_path / "nowhere"), "s"))
    with pytest.raises(InputError, match="before start"):
        list(read_stream(cfg.lake, "s", start="2026-01-02T00:00:00Z", end="2026-01-01T00:00:00Z"))
    with pytest.raises(InputError, match="bad time bound"):
        list(read_stream(cfg.lake, "s", start="tomorrow"))
    with pytest.raises(InputError, match="only raw and late"):
        list(read_stream(cfg.lake, "s", table="dlq"))


def test_compact_keeps_rows_and_offsets(scattered) -> None:
    cfg, _, topic = scattered
    before = sorted(map(_key, table_rows(cfg.lake, "s", "raw")))
    raw = DeltaTable(f"{cfg.lake}/s/raw")
    files_before = len(raw.file_uris())
    offsets = [raw.transaction_version(offset_app_id(topic, p)) for p in range(3)]
    report = compact(cfg.lake, "s", retention_hours=0)
    assert report["raw"]["files_removed"] == files_before
    assert report["raw"]["vacuumed"] == files_before
    raw = DeltaTable(f"{cfg.lake}/s/raw")
    assert len(raw.file_uris()) < files_before
    assert sorted(map(_key, table_rows(cfg.lake, "s", "raw"))) == before
    assert [raw.transaction_version(offset_app_id(topic, p)) for p in range(3)] == offsets
    # A run after compaction resumes from the same offsets: nothing new, nothing twice.
    assert run_ingest(topic, "s", cfg).accepted == 0
    keys = [_key(r) for r in read_table(cfg.lake, "s").to_pylist()]
    assert keys == sorted(before)
