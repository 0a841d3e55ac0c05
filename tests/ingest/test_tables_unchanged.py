"""The tables one fixed input gives do not change when the per-record path is made faster: record
ids, routing and every column but the run's wall clock are pinned by a digest taken with the code
before any such change (the per-record path of release 0.1)."""

from __future__ import annotations

import hashlib
import json

import pytest
from deltalake import DeltaTable

from mmlake.ingest import IngestSettings, run_ingest
from tests.fixtures.rawkafka import RawRecord, produce_raw
from tests.fixtures.streams import T0_MS, produce_mixed

#: Run once per Kafka client: both must give these very tables.
pytestmark = pytest.mark.usefixtures("kafka_client")

#: Columns that depend on when or where the test runs, not on the records: the run's clock, the
#: producer's clock (Kafka CreateTime) and the topic's generated name.
VARYING = {"ingest_time", "kafka_timestamp", "kafka_topic"}

#: sha256 of the canonical rows below, taken with the per-record path before it was optimised (and
#: after the dead-letter text of a record with a non-UTF-8 header key stopped naming the exception
#: the binding happened to raise, which differed between the clients).
DIGEST = "93cb38525303d98d14d4ae10a0e3ffff8bd361402ab17b3d809102b0996beea8"


def _canonical(lake: str) -> str:
    out = {}
    for name in ("raw", "late", "dlq"):
        rows = DeltaTable(f"{lake}/s/{name}").to_pyarrow_table().to_pylist()
        rows = [
            {
                k: (v.hex() if isinstance(v, bytes) else v.isoformat() if hasattr(v, "isoformat") else v)
                for k, v in sorted(r.items())
                if k not in VARYING
            }
            for r in rows
        ]
        for r in rows:
            r["headers"] = [
                [h["key"], h["value"].hex() if isinstance(h["value"], bytes) else h["value"]]
                for h in r.get("headers") or []
            ]
        out[name] = sorted(rows, key=lambda r: (r["kafka_partition"], r["kafka_offset"]))
    return json.dumps(out, sort_keys=True, default=str)


def test_a_fixed_input_gives_the_tables_it_gave_before(broker, producer, new_topic, tmp_path) -> None:
    topic = new_topic(partitions=3)
    produce_mixed(producer, topic, partitions=3, per_partition=40)
    good = [(b"mm-event-time", str(T0_MS + 7).encode()), (b"mm-modality", b"text")]
    produce_raw(
        broker.bootstrap,
        topic,
        2,
        [
            RawRecord(b"bad key", headers=[*good, (b"\xff\xfek", b"v")], timestamp_ms=T0_MS),
            RawRecord(None, key=b"tomb", headers=good, timestamp_ms=T0_MS),
            RawRecord(b"\xff not text", headers=good, timestamp_ms=T0_MS),
            RawRecord(
                b"far",
                headers=[(b"mm-event-time", b"9999-01-01T00:00:00Z"), (b"mm-modality", b"text")],
                timestamp_ms=T0_MS,
            ),
            RawRecord(
                b"caption",
                key=b"k",
                headers=[
                    (b"MM-Event-Time", b"2026-01-01T00:00:00.5+02:00"),
                    (b"mm-modality", b"text"),
                    (b"mm-modality", None),
                    (b"mm-modality", b"text"),
                    (b"mm-sample-id", b"s-1"),
                ],
                timestamp_ms=T0_MS,
            ),
        ],
    )
    settings = IngestSettings(
        lake=str(tmp_path / "lake"), kafka_bootstrap=broker.bootstrap, allowed_lateness_s=120, batch_max_records=11
    )  # MMLAKE_KAFKA_CLIENT from the fixture
    run_ingest(topic, "s", settings)
    text = _canonical(settings.lake)
    assert '"undecodable_record"' in text and '"missing_value"' in text and '"event_time_in_future"' in text
    assert hashlib.sha256(text.encode()).hexdigest() == DIGEST
