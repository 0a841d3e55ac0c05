"""Incremental preprocessing: the features rows a stream is missing, computed exactly once.

The missing rows are the raw records of each operator's modality with no features row by that
operator (name and version). They are committed in chunks, each moving the features table's counter
(:func:`mmlake.preprocessing.features.commit`); a run that loses a commit race re-plans from the new
state. A killed run leaves whole commits; the next run computes only what is still missing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mmlake.errors import CommitConflictError, CommitRaceLost
from mmlake.lake import scan
from mmlake.preprocessing.features import (
    PAYLOAD_COLUMNS,
    FeatureWriter,
    PreprocessSummary,
    check_hashes,
    commit,
    count,
    counter,
    dim,
    event_time_filter,
    first_per_record,
    isin,
    open_features,
    raw_table,
    runtime_json,
)
from mmlake.preprocessing.registry import OperatorSpec, Registry
from mmlake.preprocessing.settings import PreprocessSettings


def run_preprocess(
    lake: str,
    stream: str,
    settings: PreprocessSettings | None = None,
    *,
    storage_options: dict[str, str] | None = None,
    registry: Registry | None = None,
    operators: Iterable[str] | None = None,
    max_rows: int | None = None,
    run_id: str | None = None,
    writer: FeatureWriter | None = None,
    on_commit: Callable[[PreprocessSummary], None] | None = None,
    stop: threading.Event | None = None,
) -> PreprocessSummary:
    """Compute the features rows the stream is missing for its operators (see the module docstring)."""
    started = time.monotonic()
    writer = writer or FeatureWriter(
        lake, stream, settings, storage_options=storage_options, registry=registry, operators=operators
    )
    writer.open_all()
    summary = PreprocessSummary(stream, operators=writer.describe(), runtime=writer.runtime.as_dict())
    raw_dt = raw_table(writer.tables)
    metadata = {
        "mmlake.stream": stream,
        "mmlake.job": "preprocess",
        "mmlake.run": run_id or "",
        "mmlake.runtime": runtime_json(writer),
    }
    retries = writer.settings.commit_retries
    remaining = max_rows
    while True:
        dt = open_features(writer.tables, dim(writer))
        seen = counter(dt, stream)
        pending = _pending(raw_dt, dt, writer.specs)
        if remaining is not None:
            pending = pending.slice(0, remaining)
        try:
            for start in range(0, pending.num_rows, writer.settings.commit_rows):
                if stop is not None and stop.is_set():
                    break
                chunk = pending.slice(start, writer.settings.commit_rows)
                rows = writer.compute(_payloads(raw_dt, chunk))
                commit(dt, rows, stream, seen, {**metadata, "mmlake.rows": str(rows.num_rows)})
                seen += 1
                count(summary, rows)
                if remaining is not None:
                    remaining -= rows.num_rows
                if on_commit is not None:
                    on_commit(summary)
        except CommitRaceLost:
            summary.conflicts += 1
            if summary.conflicts > retries:
                raise CommitConflictError(
                    f"{stream}: lost the features commit race {summary.conflicts} times"
                ) from None
            time.sleep(min(0.05 * summary.conflicts, 1.0))
            continue
        break
    summary.seconds = time.monotonic() - started
    return summary


def _pending(raw_dt: Any, dt: Any, specs: dict[str, OperatorSpec]) -> pa.Table:
    """Raw rows (record_id, modality, event_time) that no features row covers yet, in event-time order."""
    keys = isin(scan(raw_dt, ["record_id", "modality", "event_time"]), "modality", specs)
    done = scan(dt, ["record_id", "op_name", "op_version", "op_sha256"])
    check_hashes(done, specs)
    done_ids: set[tuple[str, str]] = set()
    names = {f"{s.name}@{s.version}": m for m, s in specs.items()}
    for rid, name, version in zip(
        done.column("record_id").to_pylist(), done.column("op_name").to_pylist(), done.column("op_version").to_pylist()
    ):
        modality = names.get(f"{name}@{version}")
        if modality is not None:
            done_ids.add((rid, modality))
    seen: set[str] = set()
    keep = []
    for i, (rid, modality) in enumerate(zip(keys.column("record_id").to_pylist(), keys.column("modality").to_pylist())):
        if (rid, modality) in done_ids or rid in seen:
            continue
        seen.add(rid)
        keep.append(i)
    return keys.take(pa.array(keep, pa.int64())).sort_by([("event_time", "ascending"), ("record_id", "ascending")])


def _payloads(raw_dt: Any, chunk: pa.Table) -> pa.Table:
    """The raw rows of ``chunk`` with their payloads (files pruned by the chunk's event-time span)."""
    times = chunk.column("event_time")
    table = scan(raw_dt, PAYLOAD_COLUMNS, event_time_filter(pc.min(times), pc.max(times), closed=True))
    return first_per_record(isin(table, "record_id", chunk.column("record_id").to_pylist()))
