"""``mmlake demo``: the pipeline on generated data, with the embedded broker and no configuration.

A generated multimodal data set (images with captions, audio clips, event times over three hours)
plus a few re-sent, late and malformed records goes through the embedded broker into the lake; a
second run shows that nothing is written twice. The raw rows then go through the ONNX operators into
the features table (seeded, untrained CLIP towers unless MMLAKE_PREPROCESS_CLIP_WEIGHTS is set), and a
backfill of one hour, run twice, shows that a rerun changes nothing. A second stream, ``demo-pairs``,
whose captions stop matching their images part-way through (a pairing shuffle), goes the same way and
then through drift detection, which raises its alarm on the image-text mutual information.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

#: Bad records the demo sends, one per dead-letter reason.
_MALFORMED: list[tuple[str, bytes, list[tuple[str, bytes]]]] = [
    ("no event time", b"caption", [("mm-modality", b"text")]),
    ("bad event time", b"caption", [("mm-event-time", b"yesterday"), ("mm-modality", b"text")]),
    ("unknown modality", b"frame", [("mm-event-time", b"1700000000000"), ("mm-modality", b"video")]),
    ("broken image", b"\x89PNG\r\n\x1a\nnot really", [("mm-event-time", b"1700000000000"), ("mm-modality", b"image")]),
    ("broken audio", b"RIFF\x00\x00\x00\x00WAVEjunk", [("mm-event-time", b"1700000000000"), ("mm-modality", b"audio")]),
    ("not UTF-8", b"\xff\xfe caption", [("mm-event-time", b"1700000000000"), ("mm-modality", b"text")]),
]


def _progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stdout.write(f"\r  {label:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def run_demo(lake: str = "./lake", samples: int = 240, stream: str = "demo") -> int:
    """Run the demo and print its summary; returns the process exit code."""
    from deltalake import DeltaTable

    from flows.ingest import ingest_stream
    from ingest import EmbeddedBroker, MultimodalProducer, ensure_topic, synth
    from ingest.tables import table_uri

    for name in (stream, PAIRS_TOPIC):
        stream_dir = Path(table_uri(lake, name, "raw")).parent
        if stream_dir.exists():
            print(f"removing the previous demo stream at {stream_dir}")
            shutil.rmtree(stream_dir)
    start_ms = 1_767_225_600_000  # 2026-01-01T00:00:00Z
    span_ms = 3 * 3600 * 1000
    with EmbeddedBroker() as broker:
        print(f"embedded broker up at {broker.bootstrap}")
        topic = "demo"
        ensure_topic(broker.bootstrap, topic, partitions=3)
        parts = list(synth.samples(samples, start_ms=start_ms, span_ms=span_ms, seed=7))
        total = len(parts) + 3 + 3 + len(_MALFORMED)
        sent = 0
        with MultimodalProducer(broker.bootstrap) as producer:
            for part in parts:
                producer.send(topic, part.payload, part.modality, event_time=part.event_time_ms,
                              sample_id=part.sample_id, content_type=part.content_type)
                sent += 1
                if sent % 50 == 0:
                    _progress("produce", sent, total)
            for part in parts[-3:]:  # re-sent: duplicates
                producer.send(topic, part.payload, part.modality, event_time=part.event_time_ms,
                              sample_id=part.sample_id)
            for i in range(3):  # an hour behind the stream: late
                producer.send(topic, f"a late caption {i}".encode(), "text",
                              event_time=start_ms + span_ms - 3600_000 - i, sample_id=f"late-{i}")
            for i, (_, value, headers) in enumerate(_MALFORMED):
                producer.send_raw(topic, value, headers, key=f"bad-{i}".encode())
            sent = total
            _progress("produce", total, total)
            ensure_topic(broker.bootstrap, PAIRS_TOPIC, partitions=1)
            for part in synth.samples(PAIRS_SAMPLES, start_ms=start_ms, span_ms=3600 * 1000, seed=3,
                                      shuffle_pairs_after=PAIRS_SHUFFLE_AT):
                producer.send(PAIRS_TOPIC, part.payload, part.modality, event_time=part.event_time_ms,
                              sample_id=part.sample_id, content_type=part.content_type)
        t0 = time.monotonic()
        first = ingest_stream(topic=topic, stream=stream, lake=lake, bootstrap=broker.bootstrap)
        seconds = time.monotonic() - t0
        second = ingest_stream(topic=topic, stream=stream, lake=lake, bootstrap=broker.bootstrap)
        ingest_stream(topic=PAIRS_TOPIC, stream=PAIRS_TOPIC, lake=lake, bootstrap=broker.bootstrap)

    rows = {}
    for table in ("raw", "late", "dlq"):
        dt = DeltaTable(table_uri(lake, stream, table))
        rows[table] = dt.to_pyarrow_dataset().count_rows()
    dlq = DeltaTable(table_uri(lake, stream, "dlq")).to_pyarrow_table(columns=["error_code"])
    reasons = sorted(set(dlq.column("error_code").to_pylist()))
    print()
    print(f"mmlake demo: {sent} records produced ({samples} samples), ingested in {seconds:.1f}s")
    print(f"  {'table':<6} {'rows':>6}  location")
    for table, count in rows.items():
        print(f"  {table:<6} {count:>6}  {table_uri(lake, stream, table)}")
    print(f"  accepted={first['accepted']} late={first['late']} duplicates={first['duplicates']} "
          f"dead_lettered={first['dead_lettered']} watermark={first['watermark']}")
    print(f"  dead-letter reasons: {', '.join(reasons)}")
    print(f"  second run (exactly-once check): accepted={second['accepted']} late={second['late']} "
          f"dead_lettered={second['dead_lettered']}")
    from lineage import default_events_path

    events_path = Path(default_events_path(lake))
    events = len(events_path.read_text().splitlines()) if events_path.exists() else 0
    print(f"  lineage: {events} OpenLineage events in {events_path}")
    print(f"           try: mmlake lineage graph --lake {lake} --dataset {stream}/raw")
    from flows.preprocess import backfill_features, preprocess_stream
    from preprocessing.features import PreprocessSummary

    t0 = time.monotonic()
    features = PreprocessSummary(**preprocess_stream(stream=stream, lake=lake))
    print(f"  features ({time.monotonic() - t0:.1f}s, including generating the CLIP towers on first use):")
    print(f"    {features.line()}")
    hour = ("2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z")
    forced = backfill_features(stream=stream, start=hour[0], end=hour[1], lake=lake, force=True)
    rerun = backfill_features(stream=stream, start=hour[0], end=hour[1], lake=lake)
    print(f"  backfill {hour[0]}..{hour[1]}: {forced['rows']} rows recomputed; rerun rewrote {rerun['rows']} "
          f"({rerun['skipped_ranges']} day(s) already up to date)")
    print(f"           try: mmlake backfill --lake {lake} --stream {stream} --from {hour[0]} --to {hour[1]} --force")
    drift_ok = _drift(lake, stream)
    print("  (the cache warm-up joins the demo with the whole-pipeline deployment)")
    expected = {"raw": len(parts), "late": 3, "dlq": len(_MALFORMED)}
    ok = rows == expected and second["accepted"] == 0
    ok = ok and features.rows == rows["raw"] and features.errors == 0 and rerun["rows"] == 0 and forced["rows"] > 0
    return 0 if ok and drift_ok else 1


def _drift(lake: str, stream: str) -> bool:
    """Drift on both streams: the main one is shorter than a reference; demo-pairs raises its alarm."""
    from flows.cli import _drift_line
    from flows.drift import drift_stream
    from flows.preprocess import preprocess_stream

    short = drift_stream(stream=stream, lake=lake)
    print(f"  drift on {stream}: {short['status']}")
    t0 = time.monotonic()
    preprocess_stream(stream=PAIRS_TOPIC, lake=lake)
    result = drift_stream(stream=PAIRS_TOPIC, lake=lake, reference=PAIRS_DRIFT["reference"],
                          window=PAIRS_DRIFT["window"], step=PAIRS_DRIFT["step"], warmup=PAIRS_DRIFT["warmup"])
    raised = [a for a in result["alarms_raised"] if a["metric"] == "mi.image-text"]
    print(f"  drift on {PAIRS_TOPIC} ({PAIRS_SAMPLES} samples, captions shuffled from sample {PAIRS_SHUFFLE_AT} on; "
          f"small windows: {', '.join(f'{k}={v}' for k, v in PAIRS_DRIFT.items())}; {time.monotonic() - t0:.1f}s):")
    print(f"    {_drift_line(dict(result))}")
    if raised:
        from preprocessing.drift.report import _iso

        print(f"    image-text mutual information alarm raised by the window ending {_iso(raised[0]['window_end'])} "
              f"(the shuffle began at {_iso(1_767_225_600_000_000 + PAIRS_SHUFFLE_AT * 3600 * 10**6 // PAIRS_SAMPLES)})")
    print(f"           try: mmlake drift --lake {lake} --stream {PAIRS_TOPIC}   (docs/drift.md)")
    return bool(raised) and "collecting the reference" in short["status"]


PAIRS_TOPIC = "demo-pairs"
PAIRS_SAMPLES, PAIRS_SHUFFLE_AT = 720, 520
PAIRS_DRIFT = {"reference": 256, "window": 64, "step": 8, "warmup": 16}
