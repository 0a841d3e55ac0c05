"""The local lineage query, for users without a Marquez server: a graph around a dataset, and the
provenance of one record. Both read what the default transport wrote, on any storage: the JSON-lines
file ``<lake>/_lineage/events.jsonl`` of a local lake, the Delta table ``<lake>/_lineage/events`` of
an object-store lake (through its storage options), or both where both exist."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from mmlake.errors import MmlakeError
from mmlake.lake import StreamTables, is_local, offset_app_id, scan
from mmlake.lineage.emitter import default_events_path, default_events_table
from mmlake.lineage.naming import storage_dataset
from mmlake.lineage.transport import read_events


class LineageQueryError(MmlakeError, LookupError):
    """The dataset, record or event log asked about is not there."""


def load_events(lake: str, storage_options: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Every lineage event the default transport kept in ``lake``, oldest first."""
    events: list[dict[str, Any]] = []
    found = False
    if is_local(lake):
        path = Path(default_events_path(lake))
        if path.exists():
            found = True
            for line in path.read_text().splitlines():
                if line.strip():
                    try:
                        events.append(json.loads(line))
                    except json.JSONDecodeError:
                        continue  # a torn last line from a killed process is not worth failing the query for
    table = read_events(default_events_table(lake), storage_options)
    if table is not None:
        found = True
        events += table
    if not found:
        where = default_events_path(lake) if is_local(lake) else default_events_table(lake)
        raise LineageQueryError(f"no lineage events at {where} (run a flow with the default transport)")
    return sorted(events, key=lambda e: str(e.get("eventTime", "")))


def _dataset_id(ds: dict[str, Any]) -> str:
    return f"dataset:{ds['namespace']}:{ds['name']}"


def _job_id(job: dict[str, Any]) -> str:
    return f"job:{job['namespace']}:{job['name']}"


def lineage_graph(events: list[dict[str, Any]], dataset: str, depth: int = 2) -> dict[str, Any]:
    """Jobs and datasets within ``depth`` job hops of ``dataset`` (upstream and downstream), like
    Marquez's ``/api/v1/lineage``. ``dataset`` is a full name or a unique suffix of one."""
    edges: set[tuple[str, str]] = set()
    for event in events:
        if event.get("eventType") not in ("START", "COMPLETE", "RUNNING"):
            continue
        job = _job_id(event["job"])
        for ds in event.get("inputs") or []:
            edges.add((_dataset_id(ds), job))
        for ds in event.get("outputs") or []:
            edges.add((job, _dataset_id(ds)))
    datasets = {n for e in edges for n in e if n.startswith("dataset:")}
    matches = sorted(d for d in datasets if d.endswith(dataset) or d.split(":", 2)[2] == dataset)
    if not matches:
        raise LineageQueryError(f"no dataset named {dataset!r} in the lineage events")
    if len(matches) > 1:
        raise LineageQueryError(f"{dataset!r} names {len(matches)} datasets: {', '.join(matches)}")
    start = matches[0]
    up: dict[str, set[str]] = {}
    down: dict[str, set[str]] = {}
    for a, b in edges:
        down.setdefault(a, set()).add(b)
        up.setdefault(b, set()).add(a)
    seen = {start}
    kept: set[tuple[str, str]] = set()
    for graph, forward in ((up, False), (down, True)):
        queue = deque([(start, 0)])
        while queue:
            node, hops = queue.popleft()
            if hops >= 2 * depth:  # a job hop is dataset -> job -> dataset
                continue
            for nxt in sorted(graph.get(node, ())):
                kept.add((node, nxt) if forward else (nxt, node))
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append((nxt, hops + 1))
    return {"dataset": start, "nodes": sorted(seen), "edges": sorted(kept)}


def _version_adding(uri: str, storage_options: dict[str, str] | None, app_id: str, offset: int) -> int | None:
    """The Delta version whose commit wrote the row of Kafka ``offset``: the first version whose offset
    ``txn`` for the row's partition reaches it (rows and offsets are one commit), found by bisection
    over the table's history through deltalake, on any storage."""
    from deltalake import DeltaTable

    latest = DeltaTable(uri, storage_options=storage_options or None)
    committed = latest.transaction_version(app_id)
    if committed is None or committed < offset:
        return None
    lo, hi = 0, latest.version()
    while lo < hi:
        mid = (lo + hi) // 2
        reached = DeltaTable(uri, version=mid, storage_options=storage_options or None).transaction_version(app_id)
        if reached is not None and reached >= offset:
            hi = mid
        else:
            lo = mid + 1
    return lo


def explain_record(
    lake: str, stream: str, record_id: str, storage_options: dict[str, str] | None = None
) -> dict[str, Any]:
    """Where one record came from and what was made of it: Kafka topic/partition/offset -> raw Delta
    version and the run that wrote it -> operators and features row -> drift windows that covered it."""
    import pyarrow.compute as pc

    tables = StreamTables(lake, stream, dict(storage_options or {}))
    out: dict[str, Any] = {"record_id": record_id, "stream": stream}
    found = None
    for name in ("raw", "late"):
        dt = tables.open(name)
        if dt is None:
            continue
        # Filtered after the scan: files rewritten by delta-rs may hold string_view columns, which a
        # dataset filter will not compare with a string.
        rows = scan(
            dt, ["record_id", "kafka_topic", "kafka_partition", "kafka_offset", "event_time", "modality", "sample_id"]
        )
        rows = rows.filter(pc.equal(rows.column("record_id"), record_id)).to_pylist()
        if rows:
            row = rows[0]
            app = offset_app_id(row["kafka_topic"], row["kafka_partition"])
            found = (name, row, _version_adding(tables.uri(name), tables.options, app, row["kafka_offset"]))
            break
    if found is None:
        raise LineageQueryError(f"record {record_id!r} is in neither raw nor late of stream {stream!r}")
    table, row, version = found
    out["table"] = table
    out["kafka"] = {"topic": row["kafka_topic"], "partition": row["kafka_partition"], "offset": row["kafka_offset"]}
    out["event_time"] = row["event_time"].isoformat()
    out["modality"], out["sample_id"] = row["modality"], row["sample_id"]
    out["delta_version"] = version
    namespace, name = storage_dataset(tables.uri(table))
    out["written_by"] = None
    try:
        events = load_events(lake, storage_options)
    except LineageQueryError:
        events = []
    for event in events:
        if event.get("eventType") != "COMPLETE":
            continue
        for ds in event.get("outputs") or []:
            ds_version = ((ds.get("facets") or {}).get("version") or {}).get("datasetVersion")
            if (
                ds["namespace"] == namespace
                and ds["name"] == name
                and ds_version is not None
                and version is not None
                and int(ds_version) >= version
            ):
                kafka = [i for i in event.get("inputs") or [] if "mmlake_kafka" in (i.get("inputFacets") or {})]
                spans = kafka[0]["inputFacets"]["mmlake_kafka"]["partitions"] if kafka else []
                covers = any(
                    s["partition"] == row["kafka_partition"]
                    and s["firstOffset"] <= row["kafka_offset"] <= s["lastOffset"]
                    for s in spans
                )
                if covers:
                    out["written_by"] = {
                        "job": event["job"]["name"],
                        "run_id": event["run"]["runId"],
                        "event_time": event["eventTime"],
                    }
                    break
        if out["written_by"] and out["written_by"]["job"].endswith("ingest-micro-batches"):
            break
    features = tables.open("features")
    if features is None:
        out["features"] = None
        out["operators"] = None
    else:
        table_ = scan(features, ["record_id", "op_name", "op_version", "op_sha256"])
        mine = table_.filter(pc.equal(table_.column("record_id"), record_id)).to_pylist()
        out["features"] = len(mine)
        out["operators"] = sorted({(r.get("op_name"), r.get("op_version"), r.get("op_sha256")) for r in mine})
    drift = tables.open("drift")
    if drift is None:
        out["drift_windows"] = None
    else:
        t = row["event_time"]
        windows = scan(drift).to_pylist()
        out["drift_windows"] = [
            w for w in windows if w.get("window_start") is not None and w["window_start"] <= t <= w["window_end"]
        ]
    return out


def format_graph(graph: dict[str, Any]) -> list[str]:
    lines = [f"lineage of {graph['dataset']}"]
    for a, b in graph["edges"]:
        lines.append(f"  {a} -> {b}")
    return lines


def format_explain(info: dict[str, Any]) -> list[str]:
    k = info["kafka"]
    lines = [
        f"record {info['record_id']} ({info['modality']}, sample {info['sample_id']}, event time {info['event_time']})",
        f"  kafka: topic {k['topic']} partition {k['partition']} offset {k['offset']}",
        f"  delta: {info['stream']}/{info['table']} version {info['delta_version']}",
    ]
    w = info["written_by"]
    lines.append(
        f"  written by: {w['job']} run {w['run_id']} at {w['event_time']}"
        if w
        else "  written by: (no lineage event found)"
    )
    lines.append(
        "  operators/features: "
        + ("(no features table yet)" if info["features"] is None else f"{info['features']} rows by {info['operators']}")
    )
    lines.append(
        "  drift windows: "
        + ("(no drift table yet)" if info["drift_windows"] is None else str(len(info["drift_windows"])))
    )
    return lines
