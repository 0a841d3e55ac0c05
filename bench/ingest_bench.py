"""Kafka -> Delta ingest throughput against plain consumption of the same topic, with each client.

Each measurement runs in its own subprocess (so peak memory is its own) against one embedded broker,
and each pair (plain, ingest) is measured ``repeats`` times, interleaved; the medians are reported.
The ratio is ingest records/s over plain records/s: the share of the client's own limit we keep.
Both timings include connecting to the broker; ingest also includes opening/creating the Delta tables.
Workloads: 100,000 text records of 1 KB (100 MB) and 2,000 PNG images of ~100 KB (200 MB) into a
local lake, and the same text records into an ``s3://`` lake on a local moto S3 server (``text_1kb_s3``:
the cost of the object store, as a ratio to the same plain consumption and to the local lake).

On the local workloads, per run: plain consumption with kafka-python and with confluent-kafka
(librdkafka), a naive Kafka -> Delta copy (confluent-kafka consume, then one ``write_deltalake`` of
value, key, partition and offset: the bytes copied, nothing checked), and ``mmlake ingest`` with each
client. Targets: ``mmlake ingest`` with the default client at least 0.8x plain kafka-python
consumption and 0.5x the naive copy, peak RSS at most 1.5x the naive copy's. ``scale_out``: the text
topic's 4 partitions split between 2 processes (``partitions=[0, 1]`` and ``[2, 3]``), for ingest
(each client) and for plain consumption, against 1 process reading all 4: what a second worker buys.

Peak RSS is each child's ``VmHWM`` (the high-water mark of its own address space): ``ru_maxrss``
survives ``exec`` on Linux, so a child would report the bench process's size as its own floor.
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

#: Every child's own peak RSS in MB (see the module docstring).
_PEAK_RSS = r"""
def peak_mb():
    with open("/proc/self/status") as status:
        return int(next(line for line in status if line.startswith("VmHWM")).split()[1]) / 1024
"""

_PLAIN = (
    _PEAK_RSS
    + r"""
import json, sys, time
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
                  "peak_rss_mb": peak_mb()}))
"""
)

_PLAIN_CONFLUENT = (
    _PEAK_RSS
    + r"""
import json, sys, time
from confluent_kafka import Consumer, TopicPartition
bootstrap, topic, expected = sys.argv[1], sys.argv[2], int(sys.argv[3])
only = [int(p) for p in sys.argv[4].split(",")] if len(sys.argv) > 4 and sys.argv[4] else None
start = time.perf_counter()
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                     "enable.partition.eof": False, "fetch.wait.max.ms": 100})
parts = only or sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
consumer.assign([TopicPartition(topic, p, 0) for p in parts])
count = size = 0
while count < expected:
    for message in consumer.consume(num_messages=5000, timeout=0.5):
        if message.error() is None:
            count += 1
            size += len(message.value())
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "records": count, "bytes": size,
                  "peak_rss_mb": peak_mb()}))
"""
)

_NAIVE = (
    _PEAK_RSS
    + r"""
import json, sys, time
import pyarrow as pa
from confluent_kafka import Consumer, TopicPartition
from deltalake import write_deltalake
bootstrap, topic, expected, lake = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
start = time.perf_counter()
consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False,
                     "enable.partition.eof": False, "fetch.wait.max.ms": 100})
parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
consumer.assign([TopicPartition(topic, p, 0) for p in parts])
values, keys, partitions, offsets = [], [], [], []
while len(values) < expected:
    for message in consumer.consume(num_messages=5000, timeout=0.5):
        if message.error() is None:
            values.append(message.value()); keys.append(message.key())
            partitions.append(message.partition()); offsets.append(message.offset())
write_deltalake(lake + "/copy", pa.table({"value": pa.array(values, pa.binary()), "key": pa.array(keys, pa.binary()),
                                          "partition": pa.array(partitions, pa.int32()),
                                          "offset": pa.array(offsets, pa.int64())}))
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "records": len(values), "bytes": sum(len(v) for v in values),
                  "peak_rss_mb": peak_mb()}))
"""
)

_INGEST = (
    _PEAK_RSS
    + r"""
import json, sys, time
from mmlake.ingest import IngestSettings, run_ingest
bootstrap, topic, lake, client = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
options = json.loads(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else {}
only = [int(p) for p in sys.argv[6].split(",")] if len(sys.argv) > 6 else None
settings = IngestSettings(lake=lake, kafka_bootstrap=bootstrap, storage_options=options, kafka_client=client)
start = time.perf_counter()
summary = run_ingest(topic, "bench", settings, partitions=only)
elapsed = time.perf_counter() - start
print(json.dumps({"seconds": elapsed, "records": summary.accepted, "bytes": summary.payload_bytes,
                  "peak_rss_mb": peak_mb()}))
"""
)


def _child(code: str, *args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
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

    ensure_topic(bootstrap, topic, partitions=4)
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
            producer.send(topic, payload, kind, event_time=t0 + i, sample_id=f"s{i}", partition=i % 4)


class _S3:
    """moto's S3 server on a free loopback port, for the ``s3`` workload; a fresh bucket per lake."""

    def __enter__(self) -> _S3:
        import urllib.request

        from mmlake.ingest.broker import free_port

        self.endpoint = f"http://127.0.0.1:{free_port()}"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", self.endpoint.rsplit(":", 1)[1]],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.endpoint, timeout=2):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError("moto's S3 server did not come up") from None
                time.sleep(0.2)
        self.options = {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
        }
        self.buckets = 0
        return self

    def lake(self) -> str:
        import boto3

        self.buckets += 1
        name = f"bench-{self.buckets}"
        boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
            region_name="us-east-1",
        ).create_bucket(Bucket=name)
        return f"s3://{name}/lake"

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def _together(runs: list[tuple[str, tuple[str, ...]]]) -> dict[str, Any]:
    """Start every child at once; the wall time until the last finishes, the records of all."""
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, *args],
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        for code, args in runs
    ]
    outs = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    return {
        "seconds": time.perf_counter() - start,
        "records": sum(o["records"] for o in outs),
        "bytes": sum(o["bytes"] for o in outs),
        "peak_rss_mb": max(o["peak_rss_mb"] for o in outs),
    }


def _default_client() -> str:
    from mmlake.ingest import IngestSettings

    return str(IngestSettings.model_fields["kafka_client"].default)


def run(text_records: int = 100_000, image_records: int = 2_000, repeats: int = 3) -> dict[str, Any]:
    from mmlake.ingest import EmbeddedBroker

    clients = ["kafka-python", "confluent-kafka"]
    default = _default_client()
    workloads = {
        "text_1kb": ("text", text_records, False),
        "image_100kb": ("image", image_records, False),
        "text_1kb_s3": ("text", text_records, True),
    }
    report: dict[str, Any] = {
        "target_ratio": TARGET,
        "target_vs_naive_copy": 0.5,
        "target_rss_vs_naive_copy": 1.5,
        "default_client": default,
        "workloads": {},
    }
    with EmbeddedBroker() as broker, _S3() as s3:
        produced: set[tuple[str, int]] = set()
        for name, (kind, count, on_s3) in workloads.items():
            topic = f"bench-{kind}-{count}"
            if (kind, count) not in produced:
                _produce(broker.bootstrap, topic, kind, count)
                produced.add((kind, count))
            runs: dict[str, list[dict[str, Any]]] = {}
            for _ in range(repeats):  # interleaved, so a noisy moment hits every measurement alike
                runs.setdefault("plain_kafka_python", []).append(_child(_PLAIN, broker.bootstrap, topic, str(count)))
                if on_s3:
                    runs.setdefault("mmlake_ingest", []).append(
                        _child(_INGEST, broker.bootstrap, topic, s3.lake(), default, json.dumps(s3.options))
                    )
                    continue
                runs.setdefault("plain_confluent_kafka", []).append(
                    _child(_PLAIN_CONFLUENT, broker.bootstrap, topic, str(count))
                )
                with tempfile.TemporaryDirectory() as lake:
                    runs.setdefault("naive_copy", []).append(_child(_NAIVE, broker.bootstrap, topic, str(count), lake))
                for client in clients:
                    with tempfile.TemporaryDirectory() as lake:
                        runs.setdefault(f"mmlake_ingest_{client.replace('-', '_')}", []).append(
                            _child(_INGEST, broker.bootstrap, topic, lake, client)
                        )
            entry: dict[str, Any] = {key: _summarise(value) for key, value in runs.items()}
            if not on_s3:
                entry["mmlake_ingest"] = entry[f"mmlake_ingest_{default.replace('-', '_')}"]
            for key in [k for k in entry if k.startswith("mmlake_ingest")]:
                assert entry[key]["records"] == count, f"{key} lost or duplicated records"
            rate = {key: e["records_per_s"] for key, e in entry.items()}
            entry["ratio_records_per_s"] = round(rate["mmlake_ingest"] / rate["plain_kafka_python"], 3)
            entry["ratio_mb_per_s"] = round(
                entry["mmlake_ingest"]["mb_per_s"] / entry["plain_kafka_python"]["mb_per_s"], 3
            )
            if not on_s3:
                entry["ratios"] = {
                    **{
                        f"{c}_vs_plain_kafka_python": round(
                            rate[f"mmlake_ingest_{c.replace('-', '_')}"] / rate["plain_kafka_python"], 3
                        )
                        for c in clients
                    },
                    **{
                        f"{c}_vs_naive_copy": round(
                            rate[f"mmlake_ingest_{c.replace('-', '_')}"] / rate["naive_copy"], 3
                        )
                        for c in clients
                    },
                    **{
                        f"{c}_rss_vs_naive_copy": round(
                            entry[f"mmlake_ingest_{c.replace('-', '_')}"]["peak_rss_mb"]
                            / entry["naive_copy"]["peak_rss_mb"],
                            3,
                        )
                        for c in clients
                    },
                    "plain_confluent_vs_plain_kafka_python": round(
                        rate["plain_confluent_kafka"] / rate["plain_kafka_python"], 3
                    ),
                }
            report["workloads"][name] = entry
        # What a second worker buys: the text topic's 4 partitions in 2 processes, against 1.
        text_topic = f"bench-text-{text_records}"
        split = ["0,1", "2,3"]
        scale: dict[str, Any] = {}
        for client in clients:
            one, two = [], []
            for _ in range(repeats):
                with tempfile.TemporaryDirectory() as lake:
                    one.append(_child(_INGEST, broker.bootstrap, text_topic, lake, client))
                with tempfile.TemporaryDirectory() as lake:
                    two.append(
                        _together([(_INGEST, (broker.bootstrap, text_topic, lake, client, "", part)) for part in split])
                    )
            scale[f"mmlake_ingest_{client.replace('-', '_')}"] = {
                "one_process": _summarise(one),
                "two_processes": _summarise(two),
            }
        half = str(text_records // 2)
        one, two = [], []
        for _ in range(repeats):
            one.append(_child(_PLAIN_CONFLUENT, broker.bootstrap, text_topic, str(text_records)))
            two.append(_together([(_PLAIN_CONFLUENT, (broker.bootstrap, text_topic, half, part)) for part in split]))
        scale["plain_confluent_kafka"] = {"one_process": _summarise(one), "two_processes": _summarise(two)}
        for e in scale.values():
            e["speedup"] = round(e["two_processes"]["records_per_s"] / e["one_process"]["records_per_s"], 3)
        report["scale_out"] = scale
    local, remote = report["workloads"]["text_1kb"], report["workloads"]["text_1kb_s3"]
    remote["ratio_to_local_lake"] = round(
        remote["mmlake_ingest"]["records_per_s"] / local["mmlake_ingest"]["records_per_s"], 3
    )
    report["meets_target"] = all(
        w["ratio_records_per_s"] >= TARGET for n, w in report["workloads"].items() if not n.endswith("_s3")
    )
    report["meets_naive_copy_target"] = all(
        w["mmlake_ingest"]["records_per_s"] / w["naive_copy"]["records_per_s"] >= 0.5
        for n, w in report["workloads"].items()
        if not n.endswith("_s3")
    )
    faster = {}
    for n, w in report["workloads"].items():
        if not n.endswith("_s3"):
            rates = {c: w[f"mmlake_ingest_{c.replace('-', '_')}"]["records_per_s"] for c in clients}
            faster[n] = max(rates, key=rates.__getitem__)
    report["faster_client"] = faster
    report["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report
