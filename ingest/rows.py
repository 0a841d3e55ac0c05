"""One micro-batch's rows of one table (``raw``, ``late`` or ``dlq``) as an Arrow table.

Rows are kept as (record, outcome) pairs while a batch is routed and built into columns once, on the
commit thread (:meth:`TableRows.table`), with the payload column gathered into one Arrow buffer.
"""

from __future__ import annotations

import operator
from typing import Any

import pyarrow as pa

from mmlake import lake
from mmlake.ingest import native
from mmlake.ingest.records import Accepted, Rejected
from mmlake.ingest.tables import HEADERS_TYPE


def kafka_timestamp_us(timestamp_ms: int | None) -> int | None:
    """A Kafka record timestamp (ms; None or negative: none) as µs, None outside the supported range."""
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    us = timestamp_ms * 1000
    return us if lake.in_range(us) else None


class TableRows:
    """The rows of one table in a micro-batch, kept as (record, outcome) pairs until :meth:`table`
    builds each column with one list comprehension (cheaper than appending to every column per row)."""

    def __init__(self, schema: pa.Schema, topic: str, now_us: int) -> None:
        self.schema, self.topic, self.now_us = schema, topic, now_us
        self.accepted: list[tuple[Any, Accepted]] = []
        self.watermarks: list[int] = []  # late only: the watermark each record was behind
        self.rejected: list[tuple[Any, Rejected]] = []

    def __len__(self) -> int:
        return len(self.accepted) + len(self.rejected)

    def add_accepted(self, rec: Any, acc: Accepted) -> None:
        self.accepted.append((rec, acc))

    def add_late(self, rec: Any, acc: Accepted, watermark: int) -> None:
        self.accepted.append((rec, acc))
        self.watermarks.append(watermark)

    def add_rejected(self, rec: Any, rej: Rejected) -> None:
        self.rejected.append((rec, rej))

    def payload_bytes(self) -> int:
        return sum(len(rec.value or b"") for rec, _ in self.accepted)

    def _columns(self) -> dict[str, Any]:
        n = len(self)
        recs = [rec for rec, _ in self.accepted] + [rec for rec, _ in self.rejected]
        data: dict[str, Any] = {
            "kafka_topic": [self.topic] * n,
            "kafka_partition": [r.partition for r in recs],
            "kafka_offset": [r.offset for r in recs],
            "kafka_key": [r.key for r in recs],
            "headers": [r.headers for r in recs],
            "ingest_time": [self.now_us] * n,
        }
        if "error_code" in self.schema.names:  # dlq
            data["error_code"] = [rej.reason.value for _, rej in self.rejected]
            data["error"] = [rej.message for _, rej in self.rejected]
            data["payload"] = [r.value for r in recs]
            data["kafka_timestamp"] = [kafka_timestamp_us(r.timestamp) for r in recs]
            return data
        outs = [acc for _, acc in self.accepted]
        payloads = [r.value or b"" for r in recs]
        times = [acc.event_time_us for acc in outs]
        data.update(
            record_id=[acc.record_id for acc in outs],
            sample_id=[acc.sample_id for acc in outs],
            modality=[acc.modality for acc in outs],
            content_type=[acc.content_type for acc in outs],
            event_time=times,
            payload=payloads,
            payload_sha256=[acc.payload_sha256 for acc in outs],
            size_bytes=[len(v) for v in payloads],
            event_date=list(map(lake.day_of, times)),
        )
        if "watermark" in self.schema.names:
            data["watermark"] = self.watermarks
        return data

    def table(self) -> pa.Table:
        """The rows as an Arrow table; rows with an event time are sorted by (event time, partition,
        offset). The order is found by numpy and applied to the Python lists (an ``itemgetter`` moves
        references in C), so payload bytes are copied once, not twice."""
        data = self._columns()
        n = len(self)
        if "event_time" in data and n > 1:
            import numpy as np

            order = np.lexsort(
                (
                    np.fromiter(data["kafka_offset"], np.int64, n),
                    np.fromiter(data["kafka_partition"], np.int64, n),
                    np.fromiter(data["event_time"], np.int64, n),
                )
            )
            if (np.diff(order) != 1).any():
                take = operator.itemgetter(*order.tolist())
                data = {name: take(values) for name, values in data.items()}
        arrays = []
        for f in self.schema:
            values = data[f.name]
            if f.name == "payload" and "event_time" in data:  # never null in raw and late
                arrays.append(binary_array(values))
            elif f.name == "headers":  # lists of (key, value) pairs: Arrow takes tuples for structs
                arrays.append(pa.array(values, type=HEADERS_TYPE))
            else:
                arrays.append(pa.array(values, type=_storage_type(f.type)).cast(f.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def binary_array(values: list[bytes]) -> pa.Array:
    """A binary array built with one copy of the bytes, into a buffer of Arrow's allocator, which keeps
    its pages from batch to batch (``b"".join`` faulted in fresh ones every batch: most of the cost of
    a batch of images; ``pa.array`` regrows its buffer many times)."""
    import numpy as np

    lengths = np.fromiter((len(v) for v in values), dtype=np.int64, count=len(values))
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    total = int(offsets[-1])
    if total >= 2**31:
        return pa.array(values, type=pa.large_binary()).cast(pa.binary())
    data = pa.allocate_buffer(total)
    fast = native.module
    if fast is not None:
        fast.gather(values, data)
    else:
        view = memoryview(data).cast("B")
        for value, start, end in zip(values, offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
            view[start:end] = value
    return pa.Array.from_buffers(pa.binary(), len(values), [None, pa.py_buffer(offsets.astype(np.int32)), data])


def _storage_type(t: pa.DataType) -> pa.DataType:
    # Timestamps and dates are built from integers, then cast to their logical type.
    if pa.types.is_timestamp(t):
        return pa.int64()
    if pa.types.is_date32(t):
        return pa.int32()
    return t
