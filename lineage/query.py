"""The local lineage query, for users without a Marquez server: a graph around a dataset, and the
provenance of one record. Both read the file transport's ``<lake>/_lineage/events.jsonl``."""

from __future__ import annotations

import json
from collections import deque
from pathlib import Path
from typing import Any

from mmlake.lineage.emitter import default_events_path
from mmlake.lineage.naming import storage_dataset
from mmlake.errors import MmlakeError


class LineageQueryError(MmlakeError, LookupError):
    """The dataset, record or event log asked about is not there."""


def load_events(lake: str) -> list[dict[str, Any]]:
    path = Path(default_events_path(lake))
    if not path.exists():
        raise LineageQueryError(f"no lineage events at {path} (run a flow with the default file transport)")
    events = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line from a killed process is not worth failing the query for
    return events


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


def _delta_version_adding(table_uri: str, file_path: str) -> int | None:
    """The Delta version whose commit added ``file_path`` (relative to the table)."""
    from urllib.parse import unquote

    log_dir = Path(table_uri) / "_delta_log"
    wanted = unquote(file_path)
    for commit in sorted(log_dir.glob("*.json")):
        for line in commit.read_text().splitlines():
            action = json.loads(line)
            if "add" in action and unquote(action["add"]["path"]) == wanted:
                return int(commit.stem)
    return None


def explain_record(lake: str, stream: str, record_id: str) -> dict[str, Any]:
    """Where one record came from and what was made of it: Kafka topic/partition/offset -> raw Delta
    version and the run that wrote it -> operators and features row -> drift windows that covered it."""
    import pyarrow.dataset as pads

    from mmlake.lake import StreamTables

    tables = StreamTables(lake, stream)
    out: dict[str, Any] = {"record_id": record_id, "stream": stream}
    found = None
    for name in ("raw", "late"):
        dt = tables.open(name)
        if dt is None:
            continue
        dataset = dt.to_pyarrow_dataset()
        for fragment in dataset.get_fragments(filter=pads.field("record_id") == record_id):
            rows = fragment.to_table(filter=pads.field("record_id") == record_id,
                                     columns=["kafka_topic", "kafka_partition", "kafka_offset", "event_time",
                                              "modality", "sample_id"]).to_pylist()
            if rows:
                root = tables.uri(name).removeprefix("file://")
                relative = fragment.path.removeprefix(root).lstrip("/")
                found = (name, rows[0], _delta_version_adding(root, relative))
                break
        if found:
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
        events = load_events(lake)
    except LineageQueryError:
        events = []
    for event in events:
        if event.get("eventType") != "COMPLETE":
            continue
        for ds in event.get("outputs") or []:
            ds_version = ((ds.get("facets") or {}).get("version") or {}).get("datasetVersion")
            if ds["namespace"] == namespace and ds["name"] == name and ds_version is not None \
                    and version is not None and int(ds_version) >= version:
                kafka = [i for i in event.get("inputs") or [] if "mmlake_kafka" in (i.get("inputFacets") or {})]
                spans = kafka[0]["inputFacets"]["mmlake_kafka"]["partitions"] if kafka else []
                covers = any(s["partition"] == row["kafka_partition"] and s["firstOffset"] <= row["kafka_offset"]
                             <= s["lastOffset"] for s in spans)
                if covers:
                    out["written_by"] = {"job": event["job"]["name"], "run_id": event["run"]["runId"],
                                         "event_time": event["eventTime"]}
                    break
        if out["written_by"] and out["written_by"]["job"].endswith("ingest-micro-batches"):
            break
    features = tables.open("features")
    if features is None:
        out["features"] = None
        out["operators"] = None
    else:
        # Filtered after the scan: files rewritten by delta-rs may hold string_view columns, which a
        # dataset filter will not compare with a string.
        table = features.to_pyarrow_dataset().to_table(columns=["record_id", "op_name", "op_version", "op_sha256"])
        rows = [r for r in table.to_pylist() if r["record_id"] == record_id]
        out["features"] = len(rows)
        out["operators"] = sorted({(r.get("op_name"), r.get("op_version"), r.get("op_sha256")) for r in rows})
    drift = tables.open("drift")
    if drift is None:
        out["drift_windows"] = None
    else:
        t = row["event_time"]
        windows = drift.to_pyarrow_table().to_pylist()
        out["drift_windows"] = [w for w in windows if w.get("window_start") is not None
                                and w["window_start"] <= t <= w["window_end"]]
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
    lines.append(f"  written by: {w['job']} run {w['run_id']} at {w['event_time']}" if w
                 else "  written by: (no lineage event found)")
    lines.append("  operators/features: " + ("(no features table yet)" if info["features"] is None
                                              else f"{info['features']} rows by {info['operators']}"))
    lines.append("  drift windows: " + ("(no drift table yet)" if info["drift_windows"] is None
                                        else str(len(info["drift_windows"]))))
    return lines
