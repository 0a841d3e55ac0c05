"""Table maintenance: z-order by event time, checkpoint and vacuum (``mmlake compact``)."""

from __future__ import annotations

from typing import Any

from mmlake.lake import StreamTables


def compact(
    lake: str,
    stream: str,
    *,
    retention_hours: float = 168.0,
    storage_options: dict[str, str] | None = None,
) -> dict[str, dict[str, Any]]:
    """Z-order ``raw`` and ``late`` by ``event_time`` (compact ``dlq``), checkpoint, then vacuum.

    Vacuum removes files unreferenced for longer than ``retention_hours`` (default 7 days, Delta's own
    default; time travel to versions older than that stops working). The txn actions that hold the
    Kafka offsets survive: optimize only rewrites data files. Returns per-table metrics.
    """
    tables = StreamTables(lake, stream, storage_options or {})
    report: dict[str, dict[str, Any]] = {}
    for name in ("raw", "late", "dlq"):
        dt = tables.open(name)
        if dt is None:
            continue
        if name == "dlq":
            metrics = dt.optimize.compact()
        else:
            metrics = dt.optimize.z_order(["event_time"])
        dt.create_checkpoint()
        removed = dt.vacuum(
            retention_hours=int(retention_hours),
            dry_run=False,
            enforce_retention_duration=False,
        )
        report[name] = {
            "files_added": metrics.get("numFilesAdded", 0),
            "files_removed": metrics.get("numFilesRemoved", 0),
            "vacuumed": len(removed),
            "version": dt.version(),
        }
    return report
