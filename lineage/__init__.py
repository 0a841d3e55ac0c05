"""OpenLineage emission (naming, facets, transports) and the local lineage query.

See docs/lineage.md. Importing this package loads nothing heavy and emits nothing.
"""

from __future__ import annotations

from mmlake.lineage.emitter import LineageEmitter, default_events_path, static_run_id
from mmlake.lineage.naming import kafka_dataset, storage_dataset
from mmlake.lineage.settings import LineageSettings

__all__ = [
    "LineageEmitter",
    "LineageSettings",
    "default_events_path",
    "kafka_dataset",
    "static_run_id",
    "storage_dataset",
]
