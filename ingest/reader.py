"""Reading a stream's rows back in event-time order."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from datetime import datetime, timedelta
from typing import Any

import pyarrow as pa

from mmlake.errors import InputError
from mmlake.lake import UTC_US, StreamTables, day_of, to_epoch_us
from mmlake.lake import count_rows as lake_count_rows
from mmlake.lake import dataset as lake_dataset

_ORDER = ["event_time", "kafka_partition", "kafka_offset"]


def _file_ranges(dt: object) -> list[tuple[int, int]]:
    """(min, max) event time of each data file, from the Delta log's statistics."""
    actions = dt.get_add_actions(flatten=True)  # type: ignore[attr-defined]
    if actions.num_rows == 0:
        return []
    lo = actions.column("min.event_time").cast(UTC_US).cast(pa.int64()).to_pylist()
    hi = actions.column("max.event_time").cast(UTC_US).cast(pa.int64()).to_pylist()
    # A file without statistics could hold anything: treat it as unbounded.
    return [(a if a is not None else -(2**62), b if b is not None else 2**62) for a, b in zip(lo, hi)]


def read_stream(
    lake: str,
    stream: str,
    start: datetime | str | int | None = None,
    end: datetime | str | int | None = None,
    *,
    table: str = "raw",
    columns: Sequence[str] | None = None,
    storage_options: dict[str, str] | None = None,
    window: timedelta = timedelta(hours=1),
) -> Generator[pa.RecordBatch, None, None]:
    """Yield the rows of ``<lake>/<stream>/<table>`` with ``start <= event_time < end`` in event-time order.

    Ties are broken by Kafka partition, then offset, so the order is total and repeatable. Rows are read
    one ``window`` of event time at a time (files are skipped by their statistics), so memory holds
    one window's rows, not the table. Raises :class:`InputError` if the stream has no such table.
    """
    if table not in ("raw", "late"):
        raise InputError(f"only raw and late are ordered by event time, not {table!r}")
    lo = to_epoch_us(start)
    hi = to_epoch_us(end)
    if lo is not None and hi is not None and hi < lo:
        raise InputError(f"end ({end}) is before start ({start})")
    tables = StreamTables(lake, stream, storage_options or {})
    dt = tables.open(table)
    if dt is None:
        raise InputError(f"stream {stream!r} has no {table} table at {tables.uri(table)}")
    ranges = [(a, b) for a, b in _file_ranges(dt) if (hi is None or a < hi) and (lo is None or b >= lo)]
    if not ranges:
        return
    import pyarrow.dataset as ds

    wanted = list(columns) if columns is not None else dt.schema().to_arrow().names
    read_cols = wanted + [c for c in _ORDER if c not in wanted]
    dataset, threads = lake_dataset(dt)
    step = int(window.total_seconds() * 1_000_000)
    first = max(min(a for a, _ in ranges), lo if lo is not None else -(2**62))
    last = min(max(b for _, b in ranges), hi - 1 if hi is not None else 2**62)
    cursor = first
    while cursor <= last:
        upper = min(cursor + step, last + 1)
        if any(a < upper and b >= cursor for a, b in ranges):
            expr = (ds.field("event_time") >= pa.scalar(cursor, UTC_US)) & (
                ds.field("event_time") < pa.scalar(upper, UTC_US)
            )
            if "event_date" in dataset.schema.names:
                expr &= (ds.field("event_date") >= pa.scalar(day_of(cursor), pa.date32())) & (
                    ds.field("event_date") <= pa.scalar(day_of(upper - 1), pa.date32())
                )
            part = dataset.to_table(columns=read_cols, filter=expr, use_threads=threads)
            if part.num_rows:
                part = part.sort_by([(c, "ascending") for c in _ORDER]).select(wanted)
                yield from part.to_batches()
        else:
            # Jump to the next file that starts after this window instead of stepping through a gap.
            later = [a for a, _ in ranges if a >= upper]
            if not later:
                break
            cursor = max(upper, cursor + ((min(later) - cursor) // step) * step)
            continue
        cursor = upper


def count_rows(
    lake: str,
    stream: str,
    start: datetime | str | int | None = None,
    end: datetime | str | int | None = None,
    *,
    table: str = "raw",
    storage_options: dict[str, str] | None = None,
) -> int:
    """How many rows :func:`read_stream` yields for the same arguments (0 without the table)."""
    import pyarrow.dataset as ds

    lo, hi = to_epoch_us(start), to_epoch_us(end)
    dt = StreamTables(lake, stream, storage_options or {}).open(table)
    if dt is None:
        return 0
    expr = None
    if lo is not None:
        expr = ds.field("event_time") >= pa.scalar(lo, UTC_US)
    if hi is not None:
        upper = ds.field("event_time") < pa.scalar(hi, UTC_US)
        expr = upper if expr is None else expr & upper
    return lake_count_rows(dt, expr)


def read_table(lake: str, stream: str, **kwargs: Any) -> pa.Table:
    """All of :func:`read_stream` as one table (convenient for small ranges and tests)."""
    batches = list(read_stream(lake, stream, **kwargs))
    if batches:
        return pa.Table.from_batches(batches)
    tables = StreamTables(lake, stream, kwargs.get("storage_options") or {})
    dt = tables.open(kwargs.get("table", "raw"))
    assert dt is not None  # read_stream raised otherwise
    schema = pa.schema(dt.schema().to_arrow())
    columns = kwargs.get("columns")
    if columns:
        schema = pa.schema([schema.field(c) for c in columns])
    return schema.empty_table()
