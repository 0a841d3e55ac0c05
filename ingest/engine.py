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
import heapq
import operator
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mmlake import lake
from mmlake.errors import CommitConflictError, CommitRaceLost, MmlakeError
from mmlake.ingest import tables as ingest_tables
from mmlake.ingest import wire
from mmlake.ingest._faults import crash_point
from mmlake.ingest.errors import IngestError
from mmlake.ingest.settings import IngestSettings
from mmlake.ingest.source import KafkaSource, check_partitions, open_source
from mmlake.ingest.tables import HEADERS_TYPE, TABLES
from mmlake.lake import UTC_US, format_us

if TYPE_CHECKING:
    from deltalake import DeltaTable


#: Routing order of accepted records: (event time, partition, offset), the head of each entry.
_SORT_KEY = operator.itemgetter(0, 1, 2)


def offset_app_id(topic: str, partition: int) -> str:
    """The Delta ``txn`` app id whose version is the last committed offset of a partition."""
    return f"mmlake-ingest/{topic}/{partition}"


def max_event_app_id(topic: str, partition: int) -> str:
    """The Delta ``txn`` app id whose version is a partition's max event time (UTC epoch us)."""
    return f"mmlake-ingest/{topic}/{partition}/max-event-time-us"


@dataclass
class IngestSummary:
    """What one ingest run committed. ``offsets`` maps partition -> [first read, last committed]."""

    stream: str
    topic: str
    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    dead_lettered: int = 0
    batches: int = 0
    conflicts: int = 0
    offsets: dict[int, list[int]] = field(default_factory=dict)
    watermark_us: int | None = None
    payload_bytes: int = 0

    @property
    def watermark(self) -> str:
        return format_us(self.watermark_us)

    def line(self) -> str:
        """The one-line summary the CLI prints."""
        spans = ",".join(f"{p}:{a}-{b}" for p, (a, b) in sorted(self.offsets.items())) or "none"
        retried = f" commit_conflicts_retried={self.conflicts}" if self.conflicts else ""
        return (
            f"ingested stream={self.stream} topic={self.topic}: accepted={self.accepted} "
            f"late={self.late} duplicates={self.duplicates} dead_lettered={self.dead_lettered} "
            f"batches={self.batches} offsets={spans} watermark={self.watermark}{retried}"
        )

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["offsets"] = {str(p): span for p, span in self.offsets.items()}
        out["watermark"] = self.watermark
        return out


@dataclass
class _Batch:
    rows: dict[str, _Columns]
    last_offset: dict[int, int]
    first_offset: dict[int, int]
    duplicates: int
    new_ids: dict[str, tuple[int, str]]
    #: Each partition's max event time after this batch: the watermark state its commits record (the
    #: run's own may have moved on, routing the next batch while this one commits).
    max_event: dict[int, int | None]


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
        self.tables = self.settings.tables(stream)
        self.lateness_us = int(self.settings.allowed_lateness_s * 1_000_000)
        self.skew_us = int(self.settings.max_future_skew * 1_000_000)
        self.summary = IngestSummary(stream=stream, topic=topic)
        self._dts: dict[str, DeltaTable] = {}
        self._committed: dict[str, dict[int, int]] = {}
        self._max_event: dict[int, int | None] = {}
        self._seen = _KnownIds()  # record id -> (event time, payload SHA-256)
        self._replayed: set[tuple[int, int]] = set()  # (partition, offset) of raw rows this run reads again

    # -- state ---------------------------------------------------------------------------------

    def _load_state(self, all_partitions: list[int], assigned: list[int]) -> dict[int, int]:
        """Read offsets and watermark state from the Delta log; return where each partition resumes."""
        self._dts = {name: ingest_tables.ensure(self.tables, name) for name in TABLES}
        self._committed = {}
        table_max: dict[str, dict[int, int | None]] = {}
        for name, dt in self._dts.items():
            self._committed[name] = {}
            table_max[name] = {}
            for p in all_partitions:
                self._committed[name][p] = lake.txn_version(dt, offset_app_id(self.topic, p))
                mx = dt.transaction_version(max_event_app_id(self.topic, p))  # may be < 0 (before 1970)
                table_max[name][p] = None if mx is None else int(mx)
        resume: dict[int, int] = {}
        self._max_event = {}
        for p in all_partitions:
            # State is taken from the table that is furthest behind: the run resumes there.
            behind = min(TABLES, key=lambda name: self._committed[name][p])
            self._max_event[p] = table_max[behind][p]
            if p in assigned:
                resume[p] = self._committed[behind][p] + 1
        self._load_seen(resume)
        return resume

    def _horizon_us(self) -> int | None:
        known = [m for m in self._max_event.values() if m is not None]
        return min(known) - self.lateness_us if known else None

    def _load_seen(self, resume: dict[int, int]) -> None:
        """Record ids already in ``raw``, for de-duplication across runs: those within the lateness
        horizon, and every row the run reads again (a partition resumes where its furthest-behind table
        stopped, which can lie before raw's own offset). The rows read again are the truth about how
        their records were routed the first time (see :meth:`_route`); they are known ids whatever their
        event time, since the horizon of this run, taken from the tables that trail, need not be the
        horizon the first attempt had."""
        dt = self._dts["raw"]
        if not dt.file_uris():  # a new stream (no rows yet): nothing to know, no scan to set up
            self._seen, self._replayed = _KnownIds(), set()
            return
        import pyarrow.dataset as ds

        cutoff = self._horizon_us()
        expr = None
        if cutoff is not None:
            cut = pa.scalar(cutoff, UTC_US)
            day = pa.scalar(lake.day_of(cutoff), pa.date32())
            expr = (ds.field("event_date") >= day) & (ds.field("event_time") >= cut)
            for p, start in resume.items():
                if start <= self._committed["raw"][p]:
                    expr = expr | ((ds.field("kafka_partition") == p) & (ds.field("kafka_offset") >= start)
                                   & (ds.field("kafka_offset") <= self._committed["raw"][p]))
        table = lake.scan(dt, ["record_id", "event_time", "payload_sha256", "kafka_partition", "kafka_offset"], expr)
        self._seen = _KnownIds(_known_ids(table))
        self._replayed = {
            (p, o) for p, o in zip(table.column("kafka_partition").to_pylist(), table.column("kafka_offset").to_pylist(),
                                   strict=True)
            if p in resume and resume[p] <= o <= self._committed["raw"][p]}

    def _lookup_raw(self, ids: set[str]) -> dict[str, tuple[int, str]]:
        """The newest copy ``raw`` holds of each id in ``ids``, by a scan of raw's id column. Only a
        replayed record that the first attempt found to be a duplicate or a conflict, of a copy that is
        now outside the horizon, needs it (see :meth:`_route`)."""
        import pyarrow.compute as pc

        table = lake.scan(self._dts["raw"], ["record_id", "event_time", "payload_sha256"])
        return _known_ids(table.filter(pc.is_in(table.column("record_id"),
                                                value_set=pa.array(sorted(ids), pa.string()))))

    def _prune_seen(self) -> None:
        cutoff = self._horizon_us()
        if cutoff is not None:
            self._seen.forget_before(cutoff)

    # -- one batch -----------------------------------------------------------------------------

    def _route(self, records: list[Any]) -> _Batch:
        """Every record to exactly one of raw, late or dlq, or counted as a duplicate (see the module
        docstring). A record whose routing fails in a way no check foresaw is dead-lettered too
        (``undecodable_record``): no record stops the stream."""
        now_us = time.time_ns() // 1000
        rows = {name: _Columns(schema, self.topic, now_us) for name, (schema, _) in TABLES.items()}
        checked: list[tuple[int, int, int, Any, wire.Checked]] = []  # sort key first
        late: list[tuple[Any, wire.Checked, int]] = []
        last: dict[int, int] = {}
        first: dict[int, int] = {}
        dlq_at, late_at, max_event, lateness = self._committed["dlq"], self._committed["late"], self._max_event, \
            self.lateness_us
        for rec in records:  # offset order within each partition
            p, offset = rec.partition, rec.offset
            if p not in first:
                first[p] = offset
            last[p] = offset
            try:
                result = self._check(rec)
            except Exception as err:  # noqa: BLE001 - a bug must not become a poison pill
                result = wire.Rejected(wire.Reason.UNDECODABLE_RECORD,
                                       f"routing failed: {type(err).__name__}: {err}".splitlines()[0])
            if isinstance(result, wire.Rejected):
                if offset > dlq_at[p]:
                    rows["dlq"].add_rejected(rec, result)
                continue
            t = result.event_time_us
            mx = max_event.get(p)
            if mx is not None and t < mx - lateness:
                if offset > late_at[p]:
                    late.append((rec, result, mx - lateness))
                continue
            if mx is None or t > mx:
                max_event[p] = t
            checked.append((t, p, offset, rec, result))
        # Digests for the whole batch at once (without the GIL where the native hasher was built).
        done = wire.digest([c for *_, c in checked] + [c for _, c, _ in late],
                           [entry[3].value for entry in checked] + [rec.value for rec, _, _ in late])
        for (rec, _, watermark), acc in zip(late, done[len(checked):], strict=True):
            rows["late"].add_late(rec, acc, watermark)
        accepted = [(t, p, offset, rec, acc) for (t, p, offset, rec, _), acc in zip(checked, done[:len(checked)], strict=True)]
        # De-duplicate in event-time order, so the earliest copy is the one kept. A record id seen
        # before (in raw, or earlier in this batch) with the same payload is a duplicate; with other
        # bytes it is a conflict, dead-lettered. A record the run reads again (its offset is within
        # raw's) is routed as the first attempt did, whatever this run's horizon: raw holds it (it was
        # accepted), or the first attempt judged it against a copy raw holds (looked up when the
        # horizon no longer covers it), so its conflict reaches dlq exactly once.
        accepted.sort(key=_SORT_KEY)
        raw_at = self._committed["raw"]
        lost = {acc.record_id for _, p, offset, _, acc in accepted if offset <= raw_at[p]
                and (p, offset) not in self._replayed and acc.record_id not in self._seen}
        found = self._lookup_raw(lost) if lost else {}
        new_ids: dict[str, tuple[int, str]] = {}
        duplicates = 0
        seen, raw_rows = self._seen, rows["raw"]
        known: tuple[int, str] | None
        for _, p, offset, rec, acc in accepted:
            if offset <= raw_at[p]:
                if (p, offset) in self._replayed:  # raw holds this very record: known again from here
                    new_ids[acc.record_id] = (acc.event_time_us, acc.payload_sha256)
                    continue
                # No known copy at all (raw rows deleted since): judged a duplicate, nothing written.
                known = seen.get(acc.record_id) or found.get(acc.record_id) or (0, acc.payload_sha256)
            else:
                known = seen.get(acc.record_id) or new_ids.get(acc.record_id)
            if known is not None:
                if known[1] == acc.payload_sha256:
                    duplicates += int(offset > raw_at[p])
                elif offset > dlq_at[p]:
                    rows["dlq"].add_rejected(rec, wire.Rejected(
                        wire.Reason.RECORD_ID_CONFLICT,
                        f"record id {acc.record_id[:80]!r} was already ingested with other bytes (payload "
                        f"SHA-256 {known[1][:16]}..., this one {acc.payload_sha256[:16]}...)"))
                continue
            new_ids[acc.record_id] = (acc.event_time_us, acc.payload_sha256)
            raw_rows.add_accepted(rec, acc)
        return _Batch(rows, last, first, duplicates, new_ids, {p: max_event.get(p) for p in last})

    def _check(self, rec: Any) -> wire.Checked | wire.Rejected:
        """The record against the wire contract, with the future-time guard: its event time may lie at
        most ``max_future_skew`` past its Kafka timestamp (part of the record, so a re-read decides the
        same way), or, for a record without one, past the newest event time of its partition."""
        undecodable = getattr(rec, "undecodable", None)
        if undecodable:
            return wire.Rejected(wire.Reason.UNDECODABLE_RECORD, undecodable)
        reference = kafka_timestamp_us(rec.timestamp)
        if reference is None:
            reference = self._max_event.get(rec.partition)
        not_after = None if reference is None else reference + self.skew_us
        return wire.check(rec.key, rec.value, rec.headers, max_payload_bytes=self.settings.max_payload_bytes,
                          not_after_us=not_after)

    def _commit(self, batch: _Batch) -> dict[str, int]:
        """Commit the batch to raw, late and dlq, each with its offsets; the rows each table took (a
        table that held the batch's offsets already takes none). Raises CommitRaceLost. Runs on the
        commit thread while the next batch is routed: it touches the tables and their offsets only."""
        appended: dict[str, int] = {}
        for name in TABLES:
            if not self._must_commit(name, batch):
                continue
            data = batch.rows[name].table()
            if self._append(name, data, batch.last_offset, batch.max_event):
                appended[name] = data.num_rows
        return appended

    def _account(self, batch: _Batch, appended: dict[str, int]) -> None:
        """The summary after ``batch`` committed (``appended``: what :meth:`_commit` returned)."""
        summary = self.summary
        summary.dead_lettered += appended.get("dlq", 0)
        summary.late += appended.get("late", 0)
        if "raw" in appended:
            summary.accepted += appended["raw"]
            summary.duplicates += batch.duplicates
            summary.payload_bytes += batch.rows["raw"].payload_bytes()
        for p, last in batch.last_offset.items():
            span = summary.offsets.setdefault(p, [batch.first_offset[p], last])
            span[1] = last
        summary.batches += 1

    def _append(self, table: str, data: pa.Table, last_offset: dict[int, int],
                max_event: dict[int, int | None] | None = None) -> bool:
        """One exactly-once commit to ``table``: ``data`` plus the txn actions moving its offsets (and
        watermark state: ``max_event``, default the run's) to ``last_offset``. False when the table
        already holds those offsets. Raises CommitRaceLost when another writer got there first."""
        expect = {offset_app_id(self.topic, p): self._committed[table][p] for p in last_offset}
        txns = self._offset_txns(table, last_offset, self._max_event if max_event is None else max_event)
        if txns:
            crash_point(f"before_commit:{table}")
        done = lake.commit(self._dts[table], data, txns=txns, expect=expect,
                           metadata={"mmlake.topic": self.topic, "mmlake.stream": self.stream},
                           partition_by=TABLES[table][1])
        if not done:
            return False
        crash_point(f"after_commit:{table}")
        for p, last in last_offset.items():
            self._committed[table][p] = max(self._committed[table][p], last)
        return True

    def _must_commit(self, table: str, batch: _Batch) -> bool:
        """raw always commits; late and dlq when they have rows or their offsets trail too far."""
        if table == "raw" or len(batch.rows[table]):
            return True
        lag = max(last - self._committed[table][p] for p, last in batch.last_offset.items())
        return lag > self.settings.side_table_lag_records

    def _offset_txns(self, table: str, last_offset: dict[int, int],
                     max_event: dict[int, int | None]) -> dict[str, int]:
        """The txn versions that move ``table``'s offsets (and watermark state) to ``last_offset``."""
        txns: dict[str, int] = {}
        for p, last in last_offset.items():
            if last <= self._committed[table][p]:
                continue
            txns[offset_app_id(self.topic, p)] = last
            mx = max_event.get(p)
            if mx is not None:
                txns[max_event_app_id(self.topic, p)] = mx
        return txns

    def _finish(self, assigned: Iterable[int]) -> None:
        """Flush side-table offsets; losing that race to another writer is harmless (it flushes)."""
        try:
            self._flush_side_offsets(assigned)
        except CommitRaceLost:
            pass

    def _flush_side_offsets(self, assigned: Iterable[int]) -> None:
        """At the end of a run, bring late and dlq offsets up to raw's with offsets-only commits,
        so the next run resumes where this one stopped rather than where a side table last wrote."""
        raw = self._committed["raw"]
        for table in ("dlq", "late"):
            behind = {p: raw[p] for p in assigned if raw[p] > self._committed[table][p]}
            if behind:
                self._append(table, TABLES[table][0].empty_table(), behind)

    # -- the loop ------------------------------------------------------------------------------

    def run(self) -> IngestSummary:
        """Ingest until caught up (bounded), ``max_records`` read, or ``stop`` is set (follow)."""
        settings = self.settings
        source = open_source(settings.kafka_client, settings.kafka_bootstrap, self.topic,
                             timeout_s=settings.kafka_timeout_s)
        try:
            assigned = self.partitions if self.partitions is not None else source.available_partitions
            source_partitions = source.available_partitions
            check_partitions(self.topic, source_partitions, assigned)  # before any table is created
            resume = self._load_state(source_partitions, [p for p in assigned if p in source_partitions])
            source.assign({p: resume.get(p, 0) for p in assigned}, bounded=not self.follow)
            with _fewer_collections():
                self._loop(source, list(assigned), source_partitions)
            self._update_watermark(assigned)
            self._finish(assigned)
        finally:
            source.close()
        return self.summary

    def _loop(self, source: KafkaSource, assigned: list[int], all_partitions: list[int]) -> None:
        """Fetch, route and commit micro-batches, three at a time: while one batch is committed (on
        the commit thread: building its Arrow tables, then delta-rs writing them without the GIL), the
        next is routed and the one after it fetched. A batch's commits start only once the previous
        batch's have succeeded; when those lost a race, the batch routed meanwhile is dropped with it
        and both are read again. The source is touched by one fetch at a time."""
        from concurrent.futures import Future, ThreadPoolExecutor

        settings = self.settings
        committed_records = routed_records = 0

        def room_after(consumed: int) -> int:
            room = settings.batch_max_records
            if self.max_records is not None:
                room = min(room, self.max_records - consumed)
            return room

        def fetch(consumed: int) -> Any:
            return source.submit_fetch(room_after(consumed), settings.batch_max_bytes, settings.idle_timeout_s)

        pending: Any = None  # the next fetch
        inflight: tuple[Future[dict[str, int]], _Batch, list[Any], int | None] | None = None  # the batch committing
        streak = 0  # consecutive lost commit races: the limit is per micro-batch, not per run

        def settle() -> None:
            """Wait for the batch in flight; raises CommitRaceLost when its commits lost a race."""
            nonlocal inflight, streak, committed_records
            if inflight is None:
                return
            future, batch, records, watermark = inflight
            inflight = None
            try:
                appended = future.result()
            except MmlakeError:
                raise
            except Exception as err:
                raise IngestError(f"ingest of {self.topic!r} into {self.stream!r} failed on "
                                  f"{_spans(records)}: {type(err).__name__}: {err}".splitlines()[0]) from err
            streak = 0
            committed_records += len(records)
            self._account(batch, appended)
            if watermark is not None:
                self.summary.watermark_us = watermark
            if self.on_batch is not None:
                self.on_batch(self.summary)

        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="mmlake-commit")
        try:
            if not self.stop.is_set() and room_after(0) > 0:
                pending = fetch(0)
                self._warm_up()  # while the first batch arrives
            while True:
                records: list[Any] = []
                finished = self.stop.is_set()
                if not finished:
                    if pending is None and room_after(routed_records) <= 0:
                        finished = True
                    else:
                        if pending is None:
                            pending = fetch(routed_records)
                        records, pending = pending.result(), None
                        if not records:
                            finished = source.done()
                        elif room_after(routed_records + len(records)) > 0 and not source.done():
                            pending = fetch(routed_records + len(records))
                try:
                    batch = self._route(records) if records else None
                    settle()
                except CommitRaceLost:
                    _drain(pending)
                    pending = None
                    self.summary.conflicts += 1
                    streak += 1
                    if streak > settings.commit_retries:
                        raise CommitConflictError(
                            f"lost the Delta commit race {streak} times in a row on stream "
                            f"{self.stream!r}; is another writer stuck in a loop?"
                        ) from None
                    # Back off with jitter, so two writers on one partition stop colliding in lockstep.
                    self.stop.wait(random.uniform(0, min(1.0, 0.02 * 2**streak)))
                    resume = self._load_state(all_partitions, assigned)
                    source.seek({p: resume[p] for p in assigned})
                    routed_records = committed_records
                    continue
                except MmlakeError:
                    raise
                except Exception as err:
                    raise IngestError(f"ingest of {self.topic!r} into {self.stream!r} failed on "
                                      f"{_spans(records)}: {type(err).__name__}: {err}".splitlines()[0]) from err
                if batch is None:
                    if finished:
                        break
                    continue
                routed_records += len(records)
                # Known ids from here (the next batch is routed against them); a lost race reloads them.
                self._seen.add(batch.new_ids)
                self._prune_seen()
                inflight = (pool.submit(self._commit, batch), batch, records, self._watermark(assigned))
        finally:
            _drain(pending)
            if inflight is not None:  # leaving on an error: let the commit under way finish first
                _drain(inflight[0])
            pool.shutdown(wait=True)

    def _warm_up(self) -> None:
        """Pay what the first batch would pay once (importing ``pyarrow.compute`` for the first cast,
        Pillow and its plugins for the first image check) while the main thread waits for that batch
        anyway: on a run of images, the first table took 0.6 s, the others 20 ms."""
        for schema, _ in TABLES.values():
            _Columns(schema, self.topic, 0).table()
        wire.check(None, b"\x89PNG\r\n\x1a\n", [(wire.HEADER_EVENT_TIME, b"0"), (wire.HEADER_MODALITY, b"image")],
                   max_payload_bytes=64)

    def _watermark(self, assigned: Iterable[int]) -> int | None:
        """The stream watermark after the batches routed so far (None until every partition has one)."""
        known = [self._max_event.get(p) for p in assigned]
        if known and all(m is not None for m in known):
            return min(m for m in known if m is not None) - self.lateness_us
        return None

    def _update_watermark(self, assigned: Iterable[int]) -> None:
        watermark = self._watermark(assigned)
        if watermark is not None:
            self.summary.watermark_us = watermark


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


class _KnownIds(dict[str, tuple[int, str]]):
    """Record id -> (event time, payload SHA-256) of the ids de-duplication knows, with a heap of
    (event time, id) beside it, so forgetting those before the horizon after each batch costs what is
    forgotten, not a pass over all that is known (that pass, over a horizon's worth of ids per batch,
    was the largest single cost of a long run)."""

    def __init__(self, known: dict[str, tuple[int, str]] | None = None) -> None:
        super().__init__(known or {})
        self._heap = [(seen[0], rid) for rid, seen in self.items()]
        heapq.heapify(self._heap)

    def add(self, ids: dict[str, tuple[int, str]]) -> None:
        self.update(ids)
        heap = self._heap
        for rid, seen in ids.items():
            heapq.heappush(heap, (seen[0], rid))

    def forget_before(self, cutoff: int) -> None:
        """Forget every id whose event time is before ``cutoff``."""
        heap = self._heap
        while heap and heap[0][0] < cutoff:
            _, rid = heapq.heappop(heap)
            seen = self.get(rid)
            if seen is not None and seen[0] < cutoff:  # else: known again since, with a later time
                del self[rid]


def _known_ids(table: pa.Table) -> dict[str, tuple[int, str]]:
    """Record id -> (event time, payload SHA-256) of raw rows; for an id raw holds twice (beyond the
    horizon), the newest copy."""
    table = table.sort_by("event_time")
    times = table.column("event_time").cast(pa.int64()).to_pylist()
    return dict(zip(table.column("record_id").to_pylist(),
                    zip(times, table.column("payload_sha256").to_pylist(), strict=True), strict=True))


def _spans(records: list[Any]) -> str:
    """``partition 0 offsets 10-20, partition 1 offset 7``: where a batch lies, for error messages."""
    bounds: dict[int, list[int]] = {}
    for rec in records:
        span = bounds.setdefault(rec.partition, [rec.offset, rec.offset])
        span[0], span[1] = min(span[0], rec.offset), max(span[1], rec.offset)
    return ", ".join(f"partition {p} offset{'s' if a != b else ''} {a}{f'-{b}' if a != b else ''}"
                     for p, (a, b) in sorted(bounds.items()))


def kafka_timestamp_us(timestamp_ms: int | None) -> int | None:
    """A Kafka record timestamp (ms; None or negative: none) as µs, None outside the supported range."""
    if timestamp_ms is None or timestamp_ms < 0:
        return None
    us = timestamp_ms * 1000
    return us if lake.in_range(us) else None


def _drain(pending: Any) -> None:
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


# -- rows -------------------------------------------------------------------------------------------


class _Columns:
    """The rows of one table in a micro-batch, kept as (record, outcome) pairs until :meth:`table`
    builds each column with one list comprehension (cheaper than appending to every column per row)."""

    def __init__(self, schema: pa.Schema, topic: str, now_us: int) -> None:
        self.schema, self.topic, self.now_us = schema, topic, now_us
        self.accepted: list[tuple[Any, wire.Accepted]] = []
        self.watermarks: list[int] = []  # late only: the watermark each record was behind
        self.rejected: list[tuple[Any, wire.Rejected]] = []

    def __len__(self) -> int:
        return len(self.accepted) + len(self.rejected)

    def add_accepted(self, rec: Any, acc: wire.Accepted) -> None:
        self.accepted.append((rec, acc))

    def add_late(self, rec: Any, acc: wire.Accepted, watermark: int) -> None:
        self.accepted.append((rec, acc))
        self.watermarks.append(watermark)

    def add_rejected(self, rec: Any, rej: wire.Rejected) -> None:
        self.rejected.append((rec, rej))

    def payload_bytes(self) -> int:
        return sum(len(rec.value or b"") for rec, _ in self.accepted)

    def _columns(self) -> dict[str, Any]:
        n = len(self)
        recs = [rec for rec, _ in self.accepted] + [rec for rec, _ in self.rejected]
        data: dict[str, Any] = {
            "kafka_topic": [self.topic] * n, "kafka_partition": [r.partition for r in recs],
            "kafka_offset": [r.offset for r in recs], "kafka_key": [r.key for r in recs],
            "headers": [r.headers for r in recs], "ingest_time": [self.now_us] * n,
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
        data.update(record_id=[acc.record_id for acc in outs], sample_id=[acc.sample_id for acc in outs],
                    modality=[acc.modality for acc in outs], content_type=[acc.content_type for acc in outs],
                    event_time=times, payload=payloads, payload_sha256=[acc.payload_sha256 for acc in outs],
                    size_bytes=[len(v) for v in payloads], event_date=list(map(lake.day_of, times)))
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

            order = np.lexsort((np.fromiter(data["kafka_offset"], np.int64, n),
                                np.fromiter(data["kafka_partition"], np.int64, n),
                                np.fromiter(data["event_time"], np.int64, n)))
            if (np.diff(order) != 1).any():
                take = operator.itemgetter(*order.tolist())
                data = {name: take(values) for name, values in data.items()}
        arrays = []
        for f in self.schema:
            values = data[f.name]
            if f.name == "payload" and "event_time" in data:  # never null in raw and late
                arrays.append(_binary_array(values))
            elif f.name == "headers":  # lists of (key, value) pairs: Arrow takes tuples for structs
                arrays.append(pa.array(values, type=HEADERS_TYPE))
            else:
                arrays.append(pa.array(values, type=_storage_type(f.type)).cast(f.type))
        return pa.Table.from_arrays(arrays, schema=self.schema)


def _binary_array(values: list[bytes]) -> pa.Array:
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
    if wire._native is not None:
        wire._native.gather(values, data)
    else:
        view = memoryview(data).cast("B")  # type: ignore[arg-type]
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
