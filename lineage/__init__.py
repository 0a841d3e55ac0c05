"""OpenLineage emission (naming, facets, transports) and the local lineage query.

See ../shared/design/ARCHITECTURE.md, "Lineage", and docs/lineage.md. Importing this package loads
nothing heavy and emits nothing.
"""

from __future__ import annotations

from lineage.emitter import LineageEmitter, LineageSettings, default_events_path, static_run_id
from lineage.naming import kafka_dataset, storage_dataset

__all__ = [
    "LineageEmitter",
    "LineageSettings",
    "default_events_path",
    "kafka_dataset",
    "static_run_id",
    "storage_dataset",
]
