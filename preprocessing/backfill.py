"""Backfills: an event-time range of a stream's features recomputed.

For each UTC day of the range, one predicate overwrite replaces the operator's rows in that day's part
of the range (moving the features table's counter, as every commit to it does). Rows outside the
range and rows of other operators are not touched. A range whose rows already are exactly what the
operator would write (same records, same operator hash) is left alone, so a rerun changes nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from mmlake.errors import CommitConflictError, CommitRaceLost
from mmlake.lake import UTC_US, StreamTables, count_rows, days, iso_us, scan, time_range
from mmlake.preprocessing.features import (
    PAYLOAD_COLUMNS,
    FeatureWriter,
    PreprocessSummary,
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


def run_backfill(
    lake: str,
    stream: str,
    start: datetime | str | int,
    end: datetime | str | int,
    settings: PreprocessSettings | None = None,
    *,
    operator: str | None = None,
    force: bool = False,
    storage_options: dict[str, str] | None = None,
    registry: Registry | None = None,
    run_id: str | None = None,
    on_progress: Callable[[int, int], None] | None = None,
) -> PreprocessSummary:
    """Recompute the features of ``start <= event_time < end`` (one predicate overwrite per day of the
    range). With ``operator`` (NAME@VERSION) only that operator's modality, with that operator;
    otherwise every modality with its default operator. ``on_progress(done, total)`` counts raw rows."""
    started = time.monotonic()
    lo, hi = time_range(start, end, requirement="a backfill needs --from before --to")
    writer = FeatureWriter(
        lake,
        stream,
        settings,
        storage_options=storage_options,
        registry=registry,
        operators=[operator] if operator else None,
    )
    if operator:
        spec = writer.registry.operator(operator)
        writer.specs = {spec.modality: spec}
    writer.open_all()
    summary = PreprocessSummary(stream, operators=writer.describe(), runtime=writer.runtime.as_dict())
    raw_dt = raw_table(writer.tables)
    metadata = {
        "mmlake.stream": stream,
        "mmlake.job": "backfill",
        "mmlake.run": run_id or "",
        "mmlake.range": f"{iso_us(lo)}..{iso_us(hi)}",
        "mmlake.runtime": runtime_json(writer),
    }
    keys = isin(
        scan(
            raw_dt,
            ["record_id", "modality", "event_time"],
            event_time_filter(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US)),
        ),
        "modality",
        writer.specs,
    )
    total, done = keys.num_rows, 0
    if on_progress:
        on_progress(0, total)
    for w_lo, w_hi in days(lo, hi):
        for _attempt in range(writer.settings.commit_retries + 1):
            dt = open_features(writer.tables, dim(writer))
            seen = counter(dt, stream)
            window = _window(raw_dt, w_lo, w_hi, list(writer.specs))
            if window.num_rows == 0 and not _has_rows(dt, w_lo, w_hi, writer.specs):
                break
            if not force and _up_to_date(dt, window, w_lo, w_hi, writer.specs):
                summary.skipped_ranges += 1
                break
            rows = writer.compute(window)
            try:
                commit(
                    dt,
                    rows,
                    stream,
                    seen,
                    {**metadata, "mmlake.rows": str(rows.num_rows)},
                    predicate=_predicate(w_lo, w_hi, writer.specs),
                )
            except CommitRaceLost:
                summary.conflicts += 1
                continue
            count(summary, rows)
            break
        else:
            raise CommitConflictError(f"{stream}: lost the features commit race {summary.conflicts} times")
        done += int(
            pc.sum(
                pc.and_(
                    pc.greater_equal(keys.column("event_time"), pa.scalar(w_lo, UTC_US)),
                    pc.less(keys.column("event_time"), pa.scalar(w_hi, UTC_US)),
                )
            ).as_py()
            or 0
        )
        if on_progress:
            on_progress(done, total)
    summary.seconds = time.monotonic() - started
    return summary


def _window(raw_dt: Any, lo: int, hi: int, modalities: list[str]) -> pa.Table:
    table = isin(
        scan(raw_dt, PAYLOAD_COLUMNS, event_time_filter(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US))),
        "modality",
        modalities,
    )
    return first_per_record(table)


def _in_range(dt: Any, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> pa.Table:
    """record_id and op_sha256 of the features rows of ``specs`` in [lo, hi)."""
    rows = scan(
        dt,
        ["record_id", "op_name", "op_version", "op_sha256"],
        event_time_filter(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US)),
    )
    refs = pc.binary_join_element_wise(rows.column("op_name"), rows.column("op_version"), "@")
    mine = pc.is_in(refs, value_set=pa.array([s.ref for s in specs.values()], pa.string()))
    return rows.filter(mine).select(["record_id", "op_sha256"])


def _has_rows(dt: Any, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> bool:
    return _in_range(dt, lo, hi, specs).num_rows > 0


def _up_to_date(dt: Any, window: pa.Table, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> bool:
    """Whether the range already holds exactly one row per raw record, made by these operators' bytes."""
    have = _in_range(dt, lo, hi, specs)
    shas = {s.sha256 for s in specs.values()}
    if set(have.column("op_sha256").to_pylist()) - shas:
        return False
    ids = have.column("record_id").to_pylist()
    return len(ids) == len(set(ids)) and set(ids) == set(window.column("record_id").to_pylist())


def _predicate(lo: int, hi: int, specs: dict[str, OperatorSpec]) -> str:
    ops = " OR ".join(f"(op_name = '{_sql(s.name)}' AND op_version = '{_sql(s.version)}')" for s in specs.values())
    return f"event_time >= '{iso_us(lo)}' AND event_time < '{iso_us(hi)}' AND ({ops})"


def _sql(text: str) -> str:
    return text.replace("'", "''")


def raw_rows_in(tables: StreamTables, lo: int, hi: int) -> int:
    """How many raw rows the stream has with ``lo <= event_time < hi`` (0 without a raw table)."""
    raw = tables.open("raw")
    if raw is None:
        return 0
    return count_rows(raw, event_time_filter(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US)))


def drift_left_alone(has_drift_table: bool, features_rewritten: int | None, new_reference: bool) -> str | None:
    """Why a backfill leaves the drift table as it is, or None when the drift windows are rescored.
    ``features_rewritten``: the feature rows the backfill rewrote (None: the features stage did not
    run). Windows are rescored only when there are windows, and their inputs changed or the reference
    is to move."""
    if not has_drift_table:
        return "no drift table yet: nothing to rescore"
    if features_rewritten == 0 and not new_reference:
        return "features of the range unchanged: drift left alone"
    return None
