"""A detour through librdkafka for records kafka-python cannot decode.

kafka-python refuses a whole record batch when one record in it has a header key that is not UTF-8 (or
a structure it cannot parse): ``poll`` raises ``CorruptRecordError``, and every later fetch of that
batch fails again, so the partition never moves. librdkafka (the ``confluent-kafka`` client, already a
dependency) reads such batches record by record: a good record comes back exactly as kafka-python
would have returned it, a bad one with its offset, timestamp, key and value (its headers cannot be
decoded). The source reads the next stretch of each partition through this :class:`Detour`, moves
kafka-python past it, and hands the bad records on as :class:`Recovered` records marked
``undecodable``; the engine dead-letters them (``undecodable_record``). A kafka-python that fails again
inside the same batch takes the detour again, from where it stopped.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from mmlake.ingest import native

#: Most records one detour reads per partition before handing back to kafka-python (a record batch
#: rarely holds more; if it does, kafka-python fails again inside it and the detour goes on).
DETOUR_RECORDS = 1000


class Recovered(NamedTuple):
    """A record read through librdkafka, with the fields the engine reads from a consumed record;
    ``undecodable`` says why the record itself cannot be used (None: a good record). A named tuple:
    the confluent-kafka source makes one per record."""

    topic: str
    partition: int
    offset: int
    timestamp: int | None
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()
    undecodable: str | None = None


class Detour:
    """One librdkafka consumer for the source's topic, opened at the first detour, closed with it."""

    def __init__(self, bootstrap: str, topic: str, timeout_s: float) -> None:
        self.bootstrap, self.topic, self.timeout_s = bootstrap, topic, timeout_s
        self._consumer: Any = None

    def read(
        self,
        positions: dict[int, int],
        bounds: dict[int, int | None],
        max_records: int = DETOUR_RECORDS,
        max_bytes: int = 64 << 20,
    ) -> list[Recovered]:
        """Records of each partition from ``positions[p]`` on (below ``bounds[p]`` where one is given), in
        offset order per partition: at most ``max_records`` per partition and, over all, about
        ``max_bytes`` of values (at least one record)."""
        from confluent_kafka import KafkaError, TopicPartition

        if self._consumer is None:
            from confluent_kafka import Consumer

            self._consumer = Consumer(
                {
                    "bootstrap.servers": self.bootstrap,
                    "group.id": "mmlake-detour",
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "enable.partition.eof": True,
                    "log_level": 2,
                    "log.connection.close": False,
                }
            )
        self._consumer.assign([TopicPartition(self.topic, p, at) for p, at in positions.items()])
        taken: dict[int, list[Recovered]] = {p: [] for p in positions}
        size = 0
        open_ = {p for p, at in positions.items() if (bound := bounds.get(p)) is None or at < bound}
        deadline = time.monotonic() + self.timeout_s
        while open_ and time.monotonic() < deadline:
            message = self._consumer.poll(min(0.5, max(deadline - time.monotonic(), 0.01)))
            if message is None:
                continue
            p = message.partition()
            if p not in open_:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    open_.discard(p)
                    continue
                at = positions[p] + len(taken[p])
                taken[p].append(
                    Recovered(
                        self.topic,
                        p,
                        at,
                        None,
                        None,
                        None,
                        undecodable=f"neither Kafka client can read this record: {error.str()}",
                    )
                )
                open_.discard(p)  # an unreadable stretch ends the detour; the next fetch goes on after it
                continue
            bound = bounds.get(p)
            if bound is not None and message.offset() >= bound:
                open_.discard(p)
                continue
            taken[p].append(record_of(self.topic, message))
            size += len(message.value() or b"")
            if len(taken[p]) >= max_records:
                open_.discard(p)
            if size >= max_bytes:
                break
        return [r for p in sorted(taken) for r in taken[p]]

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def record_of(topic: str, message: Any, partition: int | None = None, offset: int | None = None) -> Recovered:
    """A librdkafka message as a record (``undecodable`` set when its headers cannot be read), at
    ``partition`` and ``offset`` where the caller read them already. Each ``value()`` call copies the
    payload: it is called once."""
    kind, ts = message.timestamp()
    headers = _headers(message)
    p = message.partition() if partition is None else partition
    at = message.offset() if offset is None else offset
    if headers is None:  # one text whichever way the binding failed, so both clients write the same row
        return Recovered(
            topic,
            p,
            at,
            ts if kind else None,
            message.key(),
            message.value(),
            (),
            "the Kafka client cannot decode this record: a header key is not UTF-8; key, value and "
            "timestamp kept, headers lost",
        )
    return _new(Recovered, (topic, p, at, ts if kind else None, message.key(), message.value(), headers, None))


#: ``tuple.__new__``: a named tuple from its items at a third of the cost of calling the class.
_new = tuple.__new__


def _headers(message: Any) -> list[tuple[str, bytes | None]] | None:
    """The message's headers, or None when the binding cannot decode them. confluent-kafka
    builds a header key that is not UTF-8 as a tuple with a missing (NULL) item: it raises
    ``SystemError`` on the first call, but another header after it can clear that error, and a cached
    list comes back on a later call; touching the missing item crashes the process. So the tuples'
    items are counted (``gc.get_referents`` skips a NULL) before any is unpacked. Each check is one
    C-level pass over the headers (this runs once per record)."""
    try:
        raw = message.headers()
        if not raw:
            return []
        fast = native.module
        if fast is not None:  # the same checks in one C call
            return list(raw) if fast.headers_ok(raw) else None
        # Every item a pair, and every pair's items, as the garbage collector sees them: a NULL item is
        # skipped. A decoding error the binding left pending surfaces here, inside the try.
        if set(map(type, raw)) != _TUPLE or set(map(len, raw)) != _PAIR or len(gc.get_referents(*raw)) != 2 * len(raw):
            return None
        # Every key a str (join refuses anything else) that survives UTF-8 (a key decoded with
        # surrogates would not survive the table either).
        "".join([name for name, _ in raw]).encode("utf-8")
    except Exception:
        return None
    return list(raw)


_TUPLE = {tuple}
_PAIR = {2}
