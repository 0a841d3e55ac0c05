"""An OpenLineage transport that keeps events in an append-only Delta table: ``<lake>/_lineage/events``.

The default for a lake on an object store, where the file transport cannot append. Each event is one
row (its time, type, job, run id and the event as JSON) in one Delta commit; concurrent writers only
append, so their commits never conflict. Registered with openlineage-python's transport factory as
kind ``mmlake_delta``, so an ``openlineage.yml`` can name it too::

    transport:
      type: mmlake_delta
      table_uri: s3://bucket/lake/_lineage/events
      storage_options: {AWS_REGION: eu-west-1}
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
from openlineage.client.transport import Config, Transport, register_transport

EVENTS_SCHEMA = pa.schema(
    [
        ("event_time", pa.string()),
        ("event_type", pa.string()),
        ("job_namespace", pa.string()),
        ("job_name", pa.string()),
        ("run_id", pa.string()),
        ("event", pa.string()),  # the whole RunEvent, as OpenLineage's JSON
    ]
)


@dataclass
class DeltaLogConfig(Config):
    table_uri: str = ""
    storage_options: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, params: dict[str, Any]) -> DeltaLogConfig:
        if not params.get("table_uri"):
            raise ValueError("the mmlake_delta transport needs a table_uri")
        return cls(
            table_uri=str(params["table_uri"]),
            storage_options={str(k): str(v) for k, v in (params.get("storage_options") or {}).items()},
        )


@register_transport
class DeltaLogTransport(Transport):
    kind = "mmlake_delta"
    config_class = DeltaLogConfig

    def __init__(self, config: DeltaLogConfig) -> None:
        self.config = config

    def emit(self, event: Any) -> None:
        from deltalake import write_deltalake
        from openlineage.client.serde import Serde

        text = Serde.to_json(event)
        doc = json.loads(text)
        job = doc.get("job") or {}
        row = pa.table(
            {
                "event_time": [doc.get("eventTime")],
                "event_type": [doc.get("eventType")],
                "job_namespace": [job.get("namespace")],
                "job_name": [job.get("name")],
                "run_id": [(doc.get("run") or {}).get("runId")],
                "event": [text],
            },
            schema=EVENTS_SCHEMA,
        )
        write_deltalake(
            self.config.table_uri,
            row,
            mode="append",
            storage_options=self.config.storage_options or None,
            name="_lineage.events",
        )


def read_events(table_uri: str, storage_options: dict[str, str] | None = None) -> list[dict[str, Any]] | None:
    """The events of a lineage events table, in commit order; None when there is no such table."""
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    from mmlake.lake import scan

    try:
        dt = DeltaTable(table_uri, storage_options=storage_options or None)
    except TableNotFoundError:
        return None
    rows = scan(dt, ["event"]).column("event").to_pylist()
    return [json.loads(r) for r in rows if r]
