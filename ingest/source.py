"""Reading Kafka partitions by explicit assignment (no consumer group), in bounded or follow mode.

Offsets come from the Delta log, not from Kafka: the caller seeks each partition to where it resumes.
A bounded run ("available now") stops at each partition's high watermark as first seen in this run.
The high watermark is taken from fetch responses, which every broker reports correctly (Tansu's
ListOffsets answer can lag behind the last record batch).

The source is pluggable (:class:`KafkaSource`); two clients implement it, registered by name in
:data:`SOURCES` and chosen by ``MMLAKE_KAFKA_CLIENT`` / ``--kafka-client``:

- ``kafka-python`` (:class:`KafkaPythonSource`): pure Python; fetching and decoding share the GIL with
  the ingest loop;
- ``confluent-kafka`` (:class:`ConfluentSource`): librdkafka, which fetches and decodes record
  batches in its own C threads, outside the GIL.

Both give the same records for the same offsets: ``partition``, ``offset``, ``timestamp`` (ms or
None), ``key``, ``value``, ``headers`` (``[(str, bytes)]``) and, for a record whose headers cannot be
decoded, ``undecodable`` (the reason; the engine dead-letters it).
"""

from __future__ import annotations

import operator
import time
from typing import TYPE_CHECKING, Any, Protocol

from mmlake.ingest.broker import wait_for_kafka, wait_for_listener
from mmlake.ingest.errors import BrokerUnavailableError, IngestError, TopicNotFoundError

if TYPE_CHECKING:
    from collections.abc import Iterable
    from concurrent.futures import Future

    from kafka import KafkaConsumer


def check_partitions(topic: str, available: Iterable[int], wanted: Iterable[int]) -> None:
    """A one-line :class:`TopicNotFoundError` unless every partition in ``wanted`` is ``available``."""
    have = set(available)
    missing = sorted(set(wanted) - have)
    if missing:
        span = f": {min(have)}..{max(have)}" if have else ""
        raise TopicNotFoundError(
            f"topic {topic!r} has no partition {', '.join(map(str, missing))} (it has {len(have)}{span})"
        )


class KafkaSource(Protocol):
    """Explicitly assigned partitions of one topic, read in offset order per partition."""

    topic: str
    bootstrap: str
    available_partitions: list[int]

    def assign(self, start: dict[int, int], *, bounded: bool) -> None:
        """Read each partition in ``start`` from its offset; bounded runs stop at the high watermark."""

    def seek(self, start: dict[int, int]) -> None:
        """Move assigned partitions back or forward (after another writer moved the Delta offsets)."""

    def done(self) -> bool:
        """In a bounded run: every partition has reached the end it had when the run first saw it."""

    def fetch(self, max_records: int, max_bytes: int, wait_s: float) -> list[Any]:
        """Up to ``max_records`` records (or ``max_bytes`` of payload), waiting at most ``wait_s`` for
        the first, sorted by partition, then offset. Raises :class:`BrokerUnavailableError` when no
        progress was possible for the source's timeout."""

    def submit_fetch(self, max_records: int, max_bytes: int, wait_s: float) -> Future[list[Any]]:
        """:meth:`fetch` on a worker thread; the caller touches the source again only after the result."""

    def close(self) -> None: ...


#: The order ``fetch`` hands records out in: by partition, then offset.
_IN_OFFSET_ORDER = operator.attrgetter("partition", "offset")


class _Prefetching:
    """``submit_fetch`` for a source whose ``fetch`` may run on one worker thread."""

    _pool: Any = None

    def fetch(self, max_records: int, max_bytes: int, wait_s: float) -> list[Any]:
        raise NotImplementedError

    def submit_fetch(self, max_records: int, max_bytes: int, wait_s: float) -> Future[list[Any]]:
        from concurrent.futures import ThreadPoolExecutor

        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmlake-fetch")
        return self._pool.submit(self.fetch, max_records, max_bytes, wait_s)

    def _shutdown(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None


class KafkaPythonSource(_Prefetching):
    """The kafka-python client; ``fetch`` returns its ``ConsumerRecord``s."""

    name = "kafka-python"

    def __init__(self, bootstrap: str, topic: str, *, timeout_s: float = 10.0) -> None:
        from kafka import KafkaConsumer, TopicPartition
        from kafka.errors import KafkaError

        wait_for_kafka(bootstrap, timeout_s)
        self.topic = topic
        self.bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._tp = TopicPartition
        try:
            self._consumer: KafkaConsumer = KafkaConsumer(
                bootstrap_servers=bootstrap,
                group_id=None,
                enable_auto_commit=False,
                fetch_max_wait_ms=100,
                max_partition_fetch_bytes=32 * 1024 * 1024,
                fetch_max_bytes=64 * 1024 * 1024,
                request_timeout_ms=int(max(timeout_s, 5) * 1000) + 1000,
                bootstrap_timeout_ms=int(timeout_s * 1000),
            )
            available = self._consumer.partitions_for_topic(topic)
        except KafkaError as err:
            raise BrokerUnavailableError(f"cannot read topic {topic!r} at {bootstrap}: {err}") from err
        if not available:
            self._consumer.close()
            raise TopicNotFoundError(f"topic {topic!r} does not exist at {bootstrap}")
        self.available_partitions = sorted(available)
        self._bounds: dict[int, int] = {}
        self._assigned: list[int] = []
        self._last_progress = time.monotonic()
        self._detour: Any = None  # librdkafka, for what kafka-python cannot decode (opened when needed)

    def assign(self, start: dict[int, int], *, bounded: bool) -> None:
        """Read each partition in ``start`` from its offset; bounded runs stop at the high watermark."""
        check_partitions(self.topic, self.available_partitions, start)
        tps = [self._tp(self.topic, p) for p in sorted(start)]
        self._consumer.assign(tps)
        for tp in tps:
            self._consumer.seek(tp, start[tp.partition])
        self._assigned = sorted(start)
        self._bounded = bounded
        self._bounds = {}
        self._last_progress = time.monotonic()

    def seek(self, start: dict[int, int]) -> None:
        """Move assigned partitions back or forward (after another writer moved the Delta offsets)."""
        for p, offset in start.items():
            self._consumer.seek(self._tp(self.topic, p), offset)
        self._last_progress = time.monotonic()

    def _learn_bounds(self) -> None:
        for p in self._assigned:
            if p not in self._bounds:
                hw = self._consumer.highwater(self._tp(self.topic, p))
                if hw is not None:
                    self._bounds[p] = hw
                    self._last_progress = time.monotonic()

    def done(self) -> bool:
        """In a bounded run: every partition has reached the end it had when the run first saw it."""
        if not self._bounded:
            return False
        if len(self._bounds) < len(self._assigned):
            return False
        return all(self._consumer.position(self._tp(self.topic, p)) >= self._bounds[p] for p in self._assigned)

    def fetch(self, max_records: int, max_bytes: int, wait_s: float) -> list[Any]:
        """Up to ``max_records`` records (or ``max_bytes`` of payload), waiting at most ``wait_s`` for the first.

        Records are kafka-python ``ConsumerRecord``s (``partition``, ``offset``, ``timestamp`` in ms,
        ``key``, ``value``, ``headers``), sorted by partition, then offset.

        Raises :class:`BrokerUnavailableError` when no progress was possible for the timeout.
        """
        from kafka.errors import CorruptRecordError

        out: list[Any] = []
        size = 0
        deadline = time.monotonic() + wait_s
        while len(out) < max_records and size < max_bytes:
            if self.done():
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 and (out or not self._bounded):
                break
            try:
                polled = self._consumer.poll(
                    timeout_ms=int(max(remaining, 0.05) * 1000), max_records=max_records - len(out)
                )
            except CorruptRecordError as err:
                recovered = self._recover(err, max_records - len(out), max_bytes - size)
                out.extend(recovered)
                size += sum(len(r.value or b"") for r in recovered)
                self._last_progress = time.monotonic()
                continue
            self._learn_bounds()
            for tp, batch in sorted(polled.items(), key=lambda item: item[0].partition):
                bound = self._bounds.get(tp.partition) if self._bounded else None
                full = bool(out) and size >= max_bytes  # another partition filled the room
                taken = [] if full else self._take(batch, bound, max_records - len(out), max_bytes - size)
                if len(taken) < len(batch):
                    # Records we did not take were consumed from the client's buffer: rewind to them.
                    self._consumer.seek(tp, taken[-1].offset + 1 if taken else batch[0].offset)
                out.extend(taken)
                size += sum(len(r.value or b"") for r in taken)
                if taken:
                    self._last_progress = time.monotonic()
            if not polled and time.monotonic() - self._last_progress > self._timeout_s:
                if self._bounded or not self._consumer.bootstrap_connected():
                    raise BrokerUnavailableError(
                        f"no answer from Kafka at {self.bootstrap} for {self._timeout_s:g}s "
                        f"while reading {self.topic!r}"
                    )
                self._last_progress = time.monotonic()
        out.sort(key=_IN_OFFSET_ORDER)
        return out

    @staticmethod
    def _take(batch: list[Any], bound: int | None, room: int, room_bytes: int) -> list[Any]:
        """The leading records of ``batch`` below ``bound`` that fit in ``room`` records and bytes."""
        end = min(len(batch), room)
        if bound is not None:
            while end and batch[end - 1].offset >= bound:
                end -= 1
        used = 0
        for i in range(end):
            if i and used >= room_bytes:
                return batch[:i]
            used += len(batch[i].value or b"")
        return batch[:end]

    def _recover(self, err: Exception, max_records: int, max_bytes: int) -> list[Any]:
        """kafka-python could not decode the next records of some partition: read the next stretch of
        every partition still to read through librdkafka (see :mod:`mmlake.ingest.recovery`) and move
        kafka-python past it. A partition is never left stuck."""
        from mmlake.ingest.recovery import DETOUR_RECORDS, Detour

        positions, bounds = {}, {}
        for p in self._assigned:
            at = self._consumer.position(self._tp(self.topic, p))
            bound = self._bounds.get(p) if self._bounded else None
            if bound is None or at < bound:
                positions[p], bounds[p] = at, bound
        if self._detour is None:
            self._detour = Detour(self.bootstrap, self.topic, self._timeout_s)
        records = self._detour.read(positions, bounds, max(1, min(max_records, DETOUR_RECORDS)), max(1, max_bytes))
        if not records:
            reason = (str(err) or type(err).__name__).splitlines()[0]
            where = ", ".join(f"partition {p} offset {at}" for p, at in sorted(positions.items()))
            raise IngestError(
                f"kafka-python cannot decode a record of {self.topic!r} ({reason}) and librdkafka "
                f"finds none at {where or 'the assigned partitions'}"
            )
        moved = {}
        for rec in records:
            moved[rec.partition] = rec.offset + 1
        for p, offset in moved.items():
            self._consumer.seek(self._tp(self.topic, p), offset)
        return records

    def close(self) -> None:
        self._shutdown()
        if self._detour is not None:
            self._detour.close()
        self._consumer.close()


class ConfluentSource(_Prefetching):
    """The confluent-kafka client (librdkafka): partitions assigned explicitly, never a group join and
    never an offset committed (``group.id`` is only a required name). librdkafka prefetches and decodes
    in its own threads; ``fetch`` turns its messages into records (:func:`~mmlake.ingest.recovery.record_of`).
    The high watermark of a bounded run is the one librdkafka cached from fetch responses."""

    name = "confluent-kafka"

    def __init__(self, bootstrap: str, topic: str, *, timeout_s: float = 10.0) -> None:
        from confluent_kafka import Consumer, KafkaException

        wait_for_listener(bootstrap, timeout_s)  # list_topics below is the metadata request
        self.topic = topic
        self.bootstrap = bootstrap
        self._timeout_s = timeout_s
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": "mmlake-ingest",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # Prefetch about 16 MB per partition (librdkafka's default queue is 64 MB): memory stays
                # bounded, and a broker that goes away is noticed rather than read past.
                "fetch.wait.max.ms": 100,
                "max.partition.fetch.bytes": 8 * 1024 * 1024,
                "fetch.max.bytes": 16 * 1024 * 1024,
                "queued.max.messages.kbytes": 16 * 1024,
                # A full prefetch queue postpones the partition's next fetch by this long (librdkafka's
                # default is 1000 ms): at the default, a consumer slower than the broker waited on every
                # refill (2.8 s of a 100k-record text run).
                "fetch.queue.backoff.ms": 10,
                "receive.message.max.bytes": 128 * 1024 * 1024,  # one record larger than a fetch still comes
                "socket.timeout.ms": int(max(timeout_s, 5) * 1000),
                "log_level": 2,
                "log.connection.close": False,
            }
        )
        try:
            metadata = self._consumer.list_topics(topic, timeout=timeout_s)
        except KafkaException as err:
            self._consumer.close()
            raise BrokerUnavailableError(f"cannot read topic {topic!r} at {bootstrap}: {err}") from err
        found = metadata.topics.get(topic)
        if found is None or found.error is not None or not found.partitions:
            self._consumer.close()
            raise TopicNotFoundError(f"topic {topic!r} does not exist at {bootstrap}")
        self.available_partitions = sorted(found.partitions)
        self._assigned: list[int] = []
        self._next: dict[int, int] = {}  # the next offset handed out, per partition
        self._bounds: dict[int, int] = {}
        self._bounded = True
        self._carry: list[Any] = []  # messages consumed beyond the last fetch's room, not handed out
        self._last_progress = time.monotonic()

    def _assign_at(self, offsets: dict[int, int]) -> None:
        from confluent_kafka import TopicPartition

        self._consumer.assign([TopicPartition(self.topic, p, offsets[p]) for p in sorted(offsets)])

    def assign(self, start: dict[int, int], *, bounded: bool) -> None:
        check_partitions(self.topic, self.available_partitions, start)
        self._assigned = sorted(start)
        self._next = dict(start)
        self._bounded = bounded
        self._bounds = {}
        self._carry = []
        self._assign_at(self._next)
        self._last_progress = time.monotonic()

    def seek(self, start: dict[int, int]) -> None:
        # Re-assigning at the new offsets drops what librdkafka prefetched from the old ones.
        self._next.update(start)
        self._carry = []
        self._assign_at({p: self._next[p] for p in self._assigned})
        self._last_progress = time.monotonic()

    def _learn_bounds(self) -> None:
        from confluent_kafka import TopicPartition

        for p in self._assigned:
            if p not in self._bounds:
                _, high = self._consumer.get_watermark_offsets(TopicPartition(self.topic, p), cached=True)
                if high >= 0:
                    self._bounds[p] = high
                    self._last_progress = time.monotonic()

    def done(self) -> bool:
        if not self._bounded or len(self._bounds) < len(self._assigned):
            return False
        return all(self._next[p] >= self._bounds[p] for p in self._assigned)

    def fetch(self, max_records: int, max_bytes: int, wait_s: float) -> list[Any]:
        from confluent_kafka import KafkaError

        from mmlake.ingest.recovery import Recovered, record_of

        _UNREADABLE = {KafkaError._BAD_MSG, KafkaError._BAD_COMPRESSION, KafkaError.INVALID_MSG}

        out: list[Any] = []
        size = 0
        deadline = time.monotonic() + wait_s
        while len(out) < max_records and size < max_bytes:
            if self._carry:  # consumed by the last fetch beyond its room: handed out first
                messages, self._carry = self._carry, []
            else:
                if self.done():
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0 and (out or not self._bounded):
                    break
                messages = self._consumer.consume(
                    num_messages=min(max_records - len(out), 100_000), timeout=max(min(remaining, 0.5), 0.05)
                )
                self._learn_bounds()
            nxt, bounds, taken = self._next, self._bounds if self._bounded else {}, len(out)
            for i, message in enumerate(messages):
                p, at_offset, error = message.partition(), message.offset(), message.error()
                if p is None or p not in nxt:
                    continue  # a broker-level event: the timeout decides
                if error is not None:
                    if error.code() in _UNREADABLE and (at_offset is None or at_offset >= nxt[p]):
                        out.append(
                            Recovered(
                                self.topic,
                                p,
                                max(at_offset or 0, nxt[p]),
                                None,
                                None,
                                None,
                                undecodable=f"the Kafka client cannot read this record: {error.str()}",
                            )
                        )
                        nxt[p] = out[-1].offset + 1
                    continue  # otherwise the end of a partition, or a transient error
                offset = int(at_offset or 0)
                if offset < nxt[p]:
                    continue  # stale from before a seek
                bound = bounds.get(p)
                if bound is not None and offset >= bound:
                    continue
                if len(out) >= max_records or (out and size >= max_bytes):
                    # Past the room: kept for the next fetch. Re-assigning instead would drop what
                    # librdkafka prefetched and fetch it again (every batch of large records did).
                    self._carry = messages[i:]
                    break
                record = record_of(self.topic, message, p, offset)
                out.append(record)
                nxt[p] = offset + 1
                size += len(record.value or b"")
            if len(out) > taken:
                self._last_progress = time.monotonic()
            if not messages and time.monotonic() - self._last_progress > self._timeout_s:
                self._check_alive()
        out.sort(key=_IN_OFFSET_ORDER)
        return out

    def _check_alive(self) -> None:
        """No record for the timeout: an error in a bounded run (it expected more), and in follow mode
        only when the broker does not answer at all."""
        from confluent_kafka import KafkaException

        if self._bounded:
            raise BrokerUnavailableError(
                f"no answer from Kafka at {self.bootstrap} for {self._timeout_s:g}s while reading {self.topic!r}"
            )
        try:
            self._consumer.list_topics(self.topic, timeout=self._timeout_s)
        except KafkaException as err:
            raise BrokerUnavailableError(
                f"no answer from Kafka at {self.bootstrap} for {self._timeout_s:g}s while reading {self.topic!r}: {err}"
            ) from err
        self._last_progress = time.monotonic()

    def close(self) -> None:
        self._shutdown()
        self._consumer.close()


#: The Kafka clients a source can be built on, by name (``MMLAKE_KAFKA_CLIENT``).
SOURCES: dict[str, type[KafkaPythonSource] | type[ConfluentSource]] = {
    KafkaPythonSource.name: KafkaPythonSource,
    ConfluentSource.name: ConfluentSource,
}


def open_source(client: str, bootstrap: str, topic: str, *, timeout_s: float = 10.0) -> KafkaSource:
    """A source on the client named ``client`` (one of :data:`SOURCES`)."""
    try:
        kind = SOURCES[client]
    except KeyError:
        raise IngestError(f"unknown Kafka client {client!r}: choose from {', '.join(sorted(SOURCES))}") from None
    return kind(bootstrap, topic, timeout_s=timeout_s)
