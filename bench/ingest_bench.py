"""Kafka -> Delta ingest throughput against plain kafka-python consumption of the same topic.

Each measurement runs in its own subprocess (so peak memory is its own) against one embedded broker,
and each pair (plain, ingest) is measured ``repeats`` times, interleaved; the medians are reported.
The ratio is ingest records/s over plain records/s: the share of the client's own limit we keep.
Both timings include connecting to the broker; ingest also includes opening/creating the Delta tables.
Workloads: 100,000 text records of 1 KB (100 MB) and 2,000 PNG images of ~100 KB (200 MB) into a
local lake, and the same text records into an ``s3://`` lake on a local moto S3 server (``text_1kb_s3``:
the cost of the object store, as a ratio to the same plain consumption and to the local lake).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

TARGET = 0.8

_PLAIN = r"""
import json, resource, sys, time
from kafka import KafkaConsumer, TopicPartition
bootstrap, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
start = time.perf_counter()  # like the ingest timing, this includes connecting and assigning
consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         fetch_max_wait_ms=100, max_partition_fetch_bytes=32 * 1024 * 1024,
                         fetch_max_bytes=64 * 1024 * 1024)
tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
consumer.assign(tps)
for tp in tps:
    consumer.seek(tp, 0)
count = size = 0
while count < expected:
    for records in consumer.poll(timeout_ms=500, max_records=5000).values():
        for record in records:
            count += 1
            size += len(record.value)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "records": count, "bytes": size,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

_INGEST = r"""
import json, resource, sys, time
from mmlake.ingest import IngestSettings, run_ingest
bootstrap, topic, lake = sys.argv[1], sys.argv[2], sys.argv[3]
options = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
settings = IngestSettings(lake=lake, kafka_bootstrap=bootstrap, storage_options=options)
start = time.perf_counter()
summary = run_ingest(topic, "bench", settings)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "records": summary.accepted, "bytes": summary.payload_bytes,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _child(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.getcwd()})
    return json.loads(out.stdout.strip().splitlines()[-1])


def _summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    seconds = statistics.median(r["seconds"] for r in runs)
    records, size = runs[0]["records"], runs[0]["bytes"]
    return {
        "records": records,
        "megabytes": round(size / 1e6, 2),
        "seconds_median": round(seconds, 3),
        "records_per_s": round(records / seconds, 1),
        "mb_per_s": round(size / 1e6 / seconds, 2),
        "peak_rss_mb": round(max(r["peak_rss_mb"] for r in runs), 1),
        "runs": len(runs),
    }


def _produce(bootstrap: str, topic: str, kind: str, count: int) -> None:
    import numpy as np

    from PIL import Image

    from mmlake.ingest import MultimodalProducer, ensure_topic

    ensure_topic(bootstrap, topic, partitions=3)
    rng = np.random.default_rng(0)
    t0 = 1_767_225_600_000
    if kind == "image":
        # Full-range noise does not compress: 182x182 RGB is a PNG of ~100 KB. 8 distinct images.
        images = []
        for _ in range(8):
            buf = io.BytesIO()
            Image.fromarray(rng.integers(0, 256, (182, 182, 3), dtype=np.uint8), "RGB").save(buf, "PNG")
            images.append(buf.getvalue())
    with MultimodalProducer(bootstrap) as producer:
        for i in range(count):
            if kind == "image":
                payload = images[i % len(images)]
            else:
                payload = (f"{i:08d} " + "lorem ipsum dolor sit amet " * 40)[:1024].encode()
            producer.send(topic, payload, kind, event_time=t0 + i, sample_id=f"s{i}", partition=i % 3)


class _S3:
    """moto's S3 server on a free loopback port, for the ``s3`` workload; a fresh bucket per lake."""

    def __enter__(self) -> _S3:
        import urllib.request

        from mmlake.ingest.broker import free_port

        self.endpoint = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                      self.endpoint.rsplit(":", 1)[1]], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.endpoint, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not come up") from None
                time.sleep(0.2)
        self.options = {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-1",
                        "AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
        self.buckets = 0
        return self

    def lake(self) -> str:
        import boto3

        self.buckets += 1
        name = f"bench-{self.buckets}"
        boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="bench", aws_secret_access_key="bench",
                     region_name="us-east-1").create_bucket(Bucket=name)
        return f"s3://{name}/lake"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def run(text_records: int = 100_000, image_records: int = 2_000, repeats: int = 3) -> dict[str, Any]:
    from mmlake.ingest import EmbeddedBroker

    workloads = {"text_1kb": ("text", text_records, False), "image_100kb": ("image", image_records, False),
                 "text_1kb_s3": ("text", text_records, True)}
    report: dict[str, Any] = {"target_ratio": TARGET, "workloads": {}}
    with EmbeddedBroker() as broker, _S3() as s3:
        produced: set[tuple[str, int]] = set()
        for name, (kind, count, on_s3) in workloads.items():
            topic = f"bench-{kind}-{count}"
            if (kind, count) not in produced:
                _produce(broker.bootstrap, topic, kind, count)
                produced.add((kind, count))
            plain, ingest = [], []
            for _ in range(repeats):
                plain.append(_child(_PLAIN, broker.bootstrap, topic, str(count)))
                if on_s3:
                    ingest.append(_child(_INGEST, broker.bootstrap, topic, s3.lake(), json.dumps(s3.options)))
                    continue
                with tempfile.TemporaryDirectory() as lake:
                    ingest.append(_child(_INGEST, broker.bootstrap, topic, lake))
            entry = {"plain_kafka_python": _summarise(plain), "mmlake_ingest": _summarise(ingest)}
            assert entry["mmlake_ingest"]["records"] == count, "ingest lost or duplicated records"
            entry["ratio_records_per_s"] = round(
                entry["mmlake_ingest"]["records_per_s"] / entry["plain_kafka_python"]["records_per_s"], 3
            )
            entry["ratio_mb_per_s"] = round(
                entry["mmlake_ingest"]["mb_per_s"] / entry["plain_kafka_python"]["mb_per_s"], 3
            )
            report["workloads"][name] = entry
    local, remote = report["workloads"]["text_1kb"], report["workloads"]["text_1kb_s3"]
    remote["ratio_to_local_lake"] = round(remote["mmlake_ingest"]["records_per_s"]
                                          / local["mmlake_ingest"]["records_per_s"], 3)
    report["meets_target"] = all(w["ratio_records_per_s"] >= TARGET for n, w in report["workloads"].items()
                                 if not n.endswith("_s3"))
    report["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report
