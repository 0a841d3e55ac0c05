"""Kafka -> Delta micro-batches with exactly-once commits and event-time routing.

How a micro-batch is made exactly-once (after kafka-delta-ingest):

* Each of the stream's tables (``raw``, ``late``, ``dlq``, committed in that order: see ``TABLES``)
  stores, in the same Delta commit as its rows, one ``txn`` action per Kafka partition whose version
  is the last offset that commit covers, and a second one holding that partition's max event time
  (the watermark state). Both are atomic with the rows.
* A run resumes each partition after the smallest offset any table has committed, and writes to each
  table only the records past that table's own offset. Routing a record depends only on its own bytes
  and on the records before it in its partition, never on batch boundaries, so a replay after a crash
  routes every record as the first attempt did: nothing is written twice, nothing is lost.
* Each commit is :func:`mmlake.lake.commit`, planned from the ``DeltaTable`` snapshot its offsets
  were read from: when another writer has committed offsets for the same partition since then (or
  such a commit is already inside the snapshot), it is refused. The batch is then dropped, the state
  reloaded and the records read again.

Event time: each partition's watermark is the max event time of its accepted records minus the
allowed lateness (as per-partition watermarks in Flink's Kafka source). A record behind its
partition's watermark goes to ``late``. The stream watermark reported is the minimum over partitions.
Duplicates (same ``record_id``, same payload) are dropped, and counted, within the lateness horizon;
the same ``record_id`` with other bytes is a conflict, dead-lettered. Every other record the wire
contract refuses, or the future-time guard (event time against the record's Kafka timestamp), goes to
``dlq`` too: no record stops a partition.
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from mmlake.errors import CommitConflictError, CommitRaceLost, MmlakeError
from mmlake.ingest import wire
from mmlake.ingest.commits import TableWriter
from mmlake.ingest.errors import IngestError
from mmlake.ingest.routing import Batch, Router
from mmlake.ingest.rows import TableRows
from mmlake.ingest.settings import IngestSettings
from mmlake.ingest.source import KafkaSource, check_partitions, open_source
from mmlake.ingest.summary import IngestSummary, spans
from mmlake.ingest.tables import TABLES

__all__ = ["IngestRun", "IngestSummary", "run_ingest"]


class IngestRun:
    """One ingest run of ``topic`` into ``<lake>/<stream>``. Call :meth:`run` once."""

    def __init__(
        self,
        topic: str,
        stream: str,
        settings: IngestSettings | None = None,
        *,
        partitions: Iterable[int] | None = None,
        follow: bool = False,
        max_records: int | None = None,
        stop: threading.Event | None = None,
        on_batch: Callable[[IngestSummary], None] | None = None,
    ) -> None:
        self.topic = topic
        self.stream = stream
        self.settings = settings or IngestSettings()
        self.partitions = sorted(set(partitions)) if partitions is not None else None
        self.follow = follow
        self.max_records = max_records
        self.stop = stop or threading.Event()
        self.on_batch = on_batch
        self.summary = IngestSummary(stream=stream, topic=topic)
        self.router = Router(topic, self.settings)
        self.writer = TableWriter(self.settings.tables(stream), topic, stream, self.settings.side_table_lag_records)

    def load_state(self, all_partitions: list[int], assigned: list[int]) -> dict[int, int]:
        """Read offsets and watermark state from the Delta log into the writer and the router; return
        where each assigned partition resumes."""
        table_max = self.writer.load(all_partitions)
        committed = self.writer.committed
        resume: dict[int, int] = {}
        max_event: dict[int, int | None] = {}
        for p in all_partitions:
            # State is taken from the table that is furthest behind: the run resumes there.
            behind = min(TABLES, key=lambda name: committed[name][p])
            max_event[p] = table_max[behind][p]
            if p in assigned:
                resume[p] = committed[behind][p] + 1
        self.router.reset(max_event, self.writer.dts["raw"], committed, resume)
        return resume

    def run(self) -> IngestSummary:
        """Ingest until caught up (bounded), ``max_records`` read, or ``stop`` is set (follow)."""
        settings = self.settings
        source = open_source(
            settings.kafka_client, settings.kafka_bootstrap, self.topic, timeout_s=settings.kafka_timeout_s
        )
        try:
            assigned = self.partitions if self.partitions is not None else source.available_partitions
            source_partitions = source.available_partitions
            check_partitions(self.topic, source_partitions, assigned)  # before any table is created
            resume = self.load_state(source_partitions, [p for p in assigned if p in source_partitions])
            source.assign({p: resume.get(p, 0) for p in assigned}, bounded=not self.follow)
            with _fewer_collections():
                _Pipeline(self, source, list(assigned), source_partitions).run()
            watermark = self.router.watermark(assigned)
            if watermark is not None:
                self.summary.watermark_us = watermark
            self.writer.finish(list(assigned), self.router.max_event)
        finally:
            source.close()
        return self.summary

    def failure(self, records: list[Any], err: Exception) -> IngestError:
        """An error no rule foresaw, on ``records``, as one line naming where they lie."""
        return IngestError(
            f"ingest of {self.topic!r} into {self.stream!r} failed on "
            f"{spans(records)}: {type(err).__name__}: {err}".splitlines()[0]
        )

    def warm_up(self) -> None:
        """Pay what the first batch would pay once (importing ``pyarrow.compute`` for the first cast,
        Pillow and its plugins for the first image check) while the main thread waits for that batch
        anyway: on a run of images, the first table took 0.6 s, the others 20 ms."""
        for schema, _ in TABLES.values():
            TableRows(schema, self.topic, 0).table()
        wire.check(
            None,
            b"\x89PNG\r\n\x1a\n",
            [(wire.HEADER_EVENT_TIME, b"0"), (wire.HEADER_MODALITY, b"image")],
            max_payload_bytes=64,
        )


class _Pipeline:
    """The loop of one run: fetch, route and commit micro-batches, three at a time. While one batch is
    committed (on the commit thread: building its Arrow tables, then delta-rs writing them without the
    GIL), the next is routed and the one after it fetched. A batch's commits start only once the previous
    batch's have succeeded; when those lost a race, the batch routed meanwhile is dropped with it and both
    are read again. The source is touched by one fetch at a time."""

    def __init__(self, run: IngestRun, source: KafkaSource, assigned: list[int], all_partitions: list[int]) -> None:
        self.owner, self.source, self.assigned, self.all_partitions = run, source, assigned, all_partitions
        self.committed_records = self.routed_records = 0
        self.pending: Future[list[Any]] | None = None  # the next fetch
        self.inflight: tuple[Future[dict[str, int]], Batch, list[Any], int | None] | None = None  # committing
        self.streak = 0  # consecutive lost commit races: the limit is per micro-batch, not per run

    def room_after(self, consumed: int) -> int:
        """How many records the next fetch may take once ``consumed`` have been read."""
        room = self.owner.settings.batch_max_records
        if self.owner.max_records is not None:
            room = min(room, self.owner.max_records - consumed)
        return room

    def fetch(self, consumed: int) -> Future[list[Any]]:
        settings = self.owner.settings
        return self.source.submit_fetch(self.room_after(consumed), settings.batch_max_bytes, settings.idle_timeout_s)

    def next_records(self) -> tuple[list[Any], bool]:
        """The next fetched records (the fetch after them already under way) and whether the run is
        finished once they are handled."""
        if self.owner.stop.is_set():
            return [], True
        if self.pending is None and self.room_after(self.routed_records) <= 0:
            return [], True
        if self.pending is None:
            self.pending = self.fetch(self.routed_records)
        records, self.pending = self.pending.result(), None
        if not records:
            return records, self.source.done()
        if self.room_after(self.routed_records + len(records)) > 0 and not self.source.done():
            self.pending = self.fetch(self.routed_records + len(records))
        return records, False

    def settle(self) -> None:
        """Wait for the batch in flight; raises CommitRaceLost when its commits lost a race."""
        if self.inflight is None:
            return
        future, batch, records, watermark = self.inflight
        self.inflight = None
        try:
            appended = future.result()
        except MmlakeError:
            raise
        except Exception as err:
            raise self.owner.failure(records, err) from err
        self.streak = 0
        self.committed_records += len(records)
        summary = self.owner.summary
        summary.account(batch, appended)
        if watermark is not None:
            summary.watermark_us = watermark
        if self.owner.on_batch is not None:
            self.owner.on_batch(summary)

    def start_over(self) -> None:
        """After a lost commit race: back off, reload the state the Delta log holds and read again from
        there. Raises CommitConflictError when the races are lost too often in a row."""
        run = self.owner
        _drain(self.pending)
        self.pending = None
        run.summary.conflicts += 1
        self.streak += 1
        if self.streak > run.settings.commit_retries:
            raise CommitConflictError(
                f"lost the Delta commit race {self.streak} times in a row on stream "
                f"{run.stream!r}; is another writer stuck in a loop?"
            ) from None
        # Back off with jitter, so two writers on one partition stop colliding in lockstep.
        run.stop.wait(random.uniform(0, min(1.0, 0.02 * 2**self.streak)))
        resume = run.load_state(self.all_partitions, self.assigned)
        self.source.seek({p: resume[p] for p in self.assigned})
        self.routed_records = self.committed_records

    def run(self) -> None:
        run = self.owner
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmlake-commit")
        try:
            if not run.stop.is_set() and self.room_after(0) > 0:
                self.pending = self.fetch(0)
                run.warm_up()  # while the first batch arrives
            while True:
                records, finished = self.next_records()
                try:
                    batch = run.router.route(records) if records else None
                    self.settle()
                except CommitRaceLost:
                    self.start_over()
                    continue
                except MmlakeError:
                    raise
                except Exception as err:
                    raise run.failure(records, err) from err
                if batch is None:
                    if finished:
                        break
                    continue
                self.routed_records += len(records)
                run.router.remember(batch)
                self.inflight = (
                    pool.submit(run.writer.commit, batch),
                    batch,
                    records,
                    run.router.watermark(self.assigned),
                )
        finally:
            _drain(self.pending)
            if self.inflight is not None:  # leaving on an error: let the commit under way finish first
                _drain(self.inflight[0])
            pool.shutdown(wait=True)


@contextlib.contextmanager
def _fewer_collections(gen0: int = 500_000) -> Iterator[None]:
    """Run the ingest loop with the cyclic garbage collector's first generation at ``gen0`` allocations
    (default 700). Each record allocates a few tuples and lists that do not form cycles; at the default,
    collections ran every ~100 records and cost ~8% of a text run. The previous thresholds come back
    afterwards."""
    import gc

    before = gc.get_threshold()
    gc.set_threshold(max(gen0, before[0]), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _drain(pending: Future[Any] | None) -> None:
    """Wait for a prefetch whose records will not be used (they are read again after a seek)."""
    if pending is None:
        return
    try:
        pending.result()
    except Exception:  # its error, if any, will recur on the next real fetch
        pass


def run_ingest(
    topic: str,
    stream: str,
    settings: IngestSettings | None = None,
    **kwargs: Any,
) -> IngestSummary:
    """Ingest ``topic`` into ``<lake>/<stream>``; see :class:`IngestRun` for the keyword arguments."""
    return IngestRun(topic, stream, settings, **kwargs).run()
