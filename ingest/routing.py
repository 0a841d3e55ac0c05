"""Routing: every record of a micro-batch to exactly one of ``raw``, ``late`` or ``dlq``, or counted as a
duplicate (see :mod:`mmlake.ingest.engine` for the rules), with the state routing keeps between batches:
each partition's max event time (the watermark state), the record ids known within the lateness
horizon, and the rows of ``raw`` a run reads again after a crash.
"""

from __future__ import annotations

import heapq
import operator
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from mmlake import lake
from mmlake.ingest import wire
from mmlake.ingest.rows import TableRows, kafka_timestamp_us
from mmlake.ingest.settings import IngestSettings
from mmlake.ingest.tables import TABLES
from mmlake.lake import UTC_US

if TYPE_CHECKING:
    from deltalake import DeltaTable

#: Routing order of accepted records: (event time, partition, offset), the head of each entry.
_SORT_KEY = operator.itemgetter(0, 1, 2)


@dataclass
class Batch:
    """One routed micro-batch: its rows per table, the offsets it covers, what de-duplication learnt."""

    rows: dict[str, TableRows]
    last_offset: dict[int, int]
    first_offset: dict[int, int]
    duplicates: int
    new_ids: dict[str, tuple[int, str]]
    #: Each partition's max event time after this batch: the watermark state its commits record (the
    #: run's own may have moved on, routing the next batch while this one commits).
    max_event: dict[int, int | None]


class Router:
    """Routes the records of one topic, batch after batch. :meth:`reset` (at the start of a run and after
    a lost commit race) takes the state the Delta log holds; :meth:`remember` takes a routed batch's ids
    before the next batch is routed."""

    def __init__(self, topic: str, settings: IngestSettings) -> None:
        self.topic = topic
        self.lateness_us = int(settings.allowed_lateness_s * 1_000_000)
        self.skew_us = int(settings.max_future_skew * 1_000_000)
        self.max_payload_bytes = settings.max_payload_bytes
        self.max_event: dict[int, int | None] = {}
        self.committed: Mapping[str, Mapping[int, int]] = {}
        self.raw: DeltaTable | None = None
        self.seen = KnownIds()  # record id -> (event time, payload SHA-256)
        self.replayed: set[tuple[int, int]] = set()  # (partition, offset) of raw rows this run reads again

    def reset(
        self,
        max_event: dict[int, int | None],
        raw: DeltaTable,
        committed: Mapping[str, Mapping[int, int]],
        resume: dict[int, int],
    ) -> None:
        """Take the state a run resumes from: each partition's max event time (``max_event``), the
        ``raw`` table and every table's committed offsets (``committed``, which the run's writer keeps
        up to date), and where each assigned partition resumes (``resume``).

        Then the record ids already in ``raw``, for de-duplication across runs: those within the lateness
        horizon, and every row the run reads again (a partition resumes where its furthest-behind table
        stopped, which can lie before raw's own offset). The rows read again are the truth about how
        their records were routed the first time (see :meth:`route`); they are known ids whatever their
        event time, since the horizon of this run, taken from the tables that trail, need not be the
        horizon the first attempt had."""
        self.max_event, self.raw, self.committed = max_event, raw, committed
        if not raw.file_uris():  # a new stream (no rows yet): nothing to know, no scan to set up
            self.seen, self.replayed = KnownIds(), set()
            return
        import pyarrow.dataset as ds

        cutoff = self.horizon_us()
        expr = None
        if cutoff is not None:
            cut = pa.scalar(cutoff, UTC_US)
            day = pa.scalar(lake.day_of(cutoff), pa.date32())
            expr = (ds.field("event_date") >= day) & (ds.field("event_time") >= cut)
            for p, start in resume.items():
                if start <= committed["raw"][p]:
                    expr = expr | (
                        (ds.field("kafka_partition") == p)
                        & (ds.field("kafka_offset") >= start)
                        & (ds.field("kafka_offset") <= committed["raw"][p])
                    )
        table = lake.scan(raw, ["record_id", "event_time", "payload_sha256", "kafka_partition", "kafka_offset"], expr)
        self.seen = KnownIds(known_ids(table))
        self.replayed = {
            (p, o)
            for p, o in zip(
                table.column("kafka_partition").to_pylist(), table.column("kafka_offset").to_pylist(), strict=True
            )
            if p in resume and resume[p] <= o <= committed["raw"][p]
        }

    def horizon_us(self) -> int | None:
        """The oldest event time de-duplication still covers (None before any partition has one)."""
        known = [m for m in self.max_event.values() if m is not None]
        return min(known) - self.lateness_us if known else None

    def watermark(self, assigned: Iterable[int]) -> int | None:
        """The stream watermark after the batches routed so far (None until every partition has one)."""
        known = [self.max_event.get(p) for p in assigned]
        if known and all(m is not None for m in known):
            return min(m for m in known if m is not None) - self.lateness_us
        return None

    def remember(self, batch: Batch) -> None:
        """Known ids from here (the next batch is routed against them; a lost race resets them), and
        those before the horizon forgotten."""
        self.seen.add(batch.new_ids)
        cutoff = self.horizon_us()
        if cutoff is not None:
            self.seen.forget_before(cutoff)

    def _lookup_raw(self, ids: set[str]) -> dict[str, tuple[int, str]]:
        """The newest copy ``raw`` holds of each id in ``ids``, by a scan of raw's id column. Only a
        replayed record that the first attempt found to be a duplicate or a conflict, of a copy that is
        now outside the horizon, needs it (see :meth:`route`)."""
        import pyarrow.compute as pc

        assert self.raw is not None, "reset() gives the router its raw table"
        table = lake.scan(self.raw, ["record_id", "event_time", "payload_sha256"])
        return known_ids(
            table.filter(pc.is_in(table.column("record_id"), value_set=pa.array(sorted(ids), pa.string())))
        )

    def route(self, records: list[Any]) -> Batch:
        """Every record to exactly one of raw, late or dlq, or counted as a duplicate (see the module
        docstring). A record whose routing fails in a way no check foresaw is dead-lettered too
        (``undecodable_record``): no record stops the stream."""
        now_us = time.time_ns() // 1000
        rows = {name: TableRows(schema, self.topic, now_us) for name, (schema, _) in TABLES.items()}
        checked: list[tuple[int, int, int, Any, wire.Checked]] = []  # sort key first
        late: list[tuple[Any, wire.Checked, int]] = []
        last: dict[int, int] = {}
        first: dict[int, int] = {}
        dlq_at, late_at, max_event, lateness = (
            self.committed["dlq"],
            self.committed["late"],
            self.max_event,
            self.lateness_us,
        )
        for rec in records:  # offset order within each partition
            p, offset = rec.partition, rec.offset
            if p not in first:
                first[p] = offset
            last[p] = offset
            try:
                result = self.check(rec)
            except Exception as err:
                result = wire.Rejected(
                    wire.Reason.UNDECODABLE_RECORD, f"routing failed: {type(err).__name__}: {err}".splitlines()[0]
                )
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
        done = wire.digest(
            [c for *_, c in checked] + [c for _, c, _ in late],
            [entry[3].value for entry in checked] + [rec.value for rec, _, _ in late],
        )
        for (rec, _, watermark), acc in zip(late, done[len(checked) :], strict=True):
            rows["late"].add_late(rec, acc, watermark)
        accepted = [
            (t, p, offset, rec, acc) for (t, p, offset, rec, _), acc in zip(checked, done[: len(checked)], strict=True)
        ]
        # De-duplicate in event-time order, so the earliest copy is the one kept. A record id seen
        # before (in raw, or earlier in this batch) with the same payload is a duplicate; with other
        # bytes it is a conflict, dead-lettered. A record the run reads again (its offset is within
        # raw's) is routed as the first attempt did, whatever this run's horizon: raw holds it (it was
        # accepted), or the first attempt judged it against a copy raw holds (looked up when the
        # horizon no longer covers it), so its conflict reaches dlq exactly once.
        accepted.sort(key=_SORT_KEY)
        raw_at = self.committed["raw"]
        lost = {
            acc.record_id
            for _, p, offset, _, acc in accepted
            if offset <= raw_at[p] and (p, offset) not in self.replayed and acc.record_id not in self.seen
        }
        found = self._lookup_raw(lost) if lost else {}
        new_ids: dict[str, tuple[int, str]] = {}
        duplicates = 0
        seen, raw_rows = self.seen, rows["raw"]
        known: tuple[int, str] | None
        for _, p, offset, rec, acc in accepted:
            if offset <= raw_at[p]:
                if (p, offset) in self.replayed:  # raw holds this very record: known again from here
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
                    rows["dlq"].add_rejected(
                        rec,
                        wire.Rejected(
                            wire.Reason.RECORD_ID_CONFLICT,
                            f"record id {acc.record_id[:80]!r} was already ingested with other bytes (payload "
                            f"SHA-256 {known[1][:16]}..., this one {acc.payload_sha256[:16]}...)",
                        ),
                    )
                continue
            new_ids[acc.record_id] = (acc.event_time_us, acc.payload_sha256)
            raw_rows.add_accepted(rec, acc)
        return Batch(rows, last, first, duplicates, new_ids, {p: max_event.get(p) for p in last})

    def check(self, rec: Any) -> wire.Checked | wire.Rejected:
        """The record against the wire contract, with the future-time guard: its event time may lie at
        most ``max_future_skew`` past its Kafka timestamp (part of the record, so a re-read decides the
        same way), or, for a record without one, past the newest event time of its partition."""
        undecodable = getattr(rec, "undecodable", None)
        if undecodable:
            return wire.Rejected(wire.Reason.UNDECODABLE_RECORD, undecodable)
        reference = kafka_timestamp_us(rec.timestamp)
        if reference is None:
            reference = self.max_event.get(rec.partition)
        not_after = None if reference is None else reference + self.skew_us
        return wire.check(
            rec.key, rec.value, rec.headers, max_payload_bytes=self.max_payload_bytes, not_after_us=not_after
        )


class KnownIds(dict[str, tuple[int, str]]):
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


def known_ids(table: pa.Table) -> dict[str, tuple[int, str]]:
    """Record id -> (event time, payload SHA-256) of raw rows; for an id raw holds twice (beyond the
    horizon), the newest copy."""
    table = table.sort_by("event_time")
    times = table.column("event_time").cast(pa.int64()).to_pylist()
    return dict(
        zip(
            table.column("record_id").to_pylist(),
            zip(times, table.column("payload_sha256").to_pylist(), strict=True),
            strict=True,
        )
    )
