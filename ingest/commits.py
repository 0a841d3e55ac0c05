"""The writer of one ingest run: each micro-batch into ``raw``, ``late`` and ``dlq``, each commit with
the ``txn`` actions that move that table's Kafka offsets (and watermark state) in the same Delta commit
(see :mod:`mmlake.ingest.engine`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from mmlake import lake
from mmlake.errors import CommitRaceLost
from mmlake.ingest import tables as ingest_tables
from mmlake.ingest._faults import crash_point
from mmlake.ingest.routing import Batch
from mmlake.ingest.tables import TABLES
from mmlake.lake import StreamTables, max_event_app_id, offset_app_id

if TYPE_CHECKING:
    from deltalake import DeltaTable


class TableWriter:
    """The stream's three tables and the offsets each has committed, per partition (``committed``:
    table -> partition -> last offset, -1 for none). :meth:`commit` runs on the run's commit thread; it
    touches only the tables and their offsets."""

    def __init__(self, tables: StreamTables, topic: str, stream: str, side_table_lag_records: int) -> None:
        self.tables, self.topic, self.stream = tables, topic, stream
        self.side_table_lag_records = side_table_lag_records
        self.dts: dict[str, DeltaTable] = {}
        self.committed: dict[str, dict[int, int]] = {}

    def load(self, partitions: list[int]) -> dict[str, dict[int, int | None]]:
        """Open (or create) the tables and read each one's offsets from its Delta log; returns each
        table's watermark state (partition -> max event time, None for none)."""
        self.dts = {name: ingest_tables.ensure(self.tables, name) for name in TABLES}
        self.committed = {}
        table_max: dict[str, dict[int, int | None]] = {}
        for name, dt in self.dts.items():
            self.committed[name] = {}
            table_max[name] = {}
            for p in partitions:
                self.committed[name][p] = lake.txn_version(dt, offset_app_id(self.topic, p))
                mx = dt.transaction_version(max_event_app_id(self.topic, p))  # may be < 0 (before 1970)
                table_max[name][p] = None if mx is None else int(mx)
        return table_max

    def commit(self, batch: Batch) -> dict[str, int]:
        """Commit the batch to raw, late and dlq, each with its offsets; the rows each table took (a
        table that held the batch's offsets already takes none). Raises CommitRaceLost. Runs on the
        commit thread while the next batch is routed: it touches the tables and their offsets only."""
        appended: dict[str, int] = {}
        for name in TABLES:
            if not self._must_commit(name, batch):
                continue
            data = batch.rows[name].table()
            if self.append(name, data, batch.last_offset, batch.max_event):
                appended[name] = data.num_rows
        return appended

    def append(self, table: str, data: pa.Table, last_offset: dict[int, int], max_event: dict[int, int | None]) -> bool:
        """One exactly-once commit to ``table``: ``data`` plus the txn actions moving its offsets (and
        watermark state: ``max_event``) to ``last_offset``. False when the table
        already holds those offsets. Raises CommitRaceLost when another writer got there first."""
        expect = {offset_app_id(self.topic, p): self.committed[table][p] for p in last_offset}
        txns = self._offset_txns(table, last_offset, max_event)
        if txns:
            crash_point(f"before_commit:{table}")
        done = lake.commit(
            self.dts[table],
            data,
            txns=txns,
            expect=expect,
            metadata={"mmlake.topic": self.topic, "mmlake.stream": self.stream},
            partition_by=TABLES[table][1],
        )
        if not done:
            return False
        crash_point(f"after_commit:{table}")
        for p, last in last_offset.items():
            self.committed[table][p] = max(self.committed[table][p], last)
        return True

    def _must_commit(self, table: str, batch: Batch) -> bool:
        """raw always commits; late and dlq when they have rows or their offsets trail too far."""
        if table == "raw" or len(batch.rows[table]):
            return True
        lag = max(last - self.committed[table][p] for p, last in batch.last_offset.items())
        return lag > self.side_table_lag_records

    def _offset_txns(self, table: str, last_offset: dict[int, int], max_event: dict[int, int | None]) -> dict[str, int]:
        """The txn versions that move ``table``'s offsets (and watermark state) to ``last_offset``."""
        txns: dict[str, int] = {}
        for p, last in last_offset.items():
            if last <= self.committed[table][p]:
                continue
            txns[offset_app_id(self.topic, p)] = last
            mx = max_event.get(p)
            if mx is not None:
                txns[max_event_app_id(self.topic, p)] = mx
        return txns

    def finish(self, assigned: list[int], max_event: dict[int, int | None]) -> None:
        """At the end of a run, bring late and dlq offsets (and watermark state, ``max_event``) up to
        raw's with offsets-only commits, so the next run resumes where this one stopped rather than where
        a side table last wrote. Losing that race to another writer is harmless (it flushes)."""
        raw = self.committed["raw"]
        try:
            for table in ("dlq", "late"):
                behind = {p: raw[p] for p in assigned if raw[p] > self.committed[table][p]}
                if behind:
                    self.append(table, TABLES[table][0].empty_table(), behind, max_event)
        except CommitRaceLost:
            pass
