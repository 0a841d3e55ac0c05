"""Prefect flows (thin orchestration over the library packages) and the ``mmlake`` CLI.

Importing this package does not import Prefect; import ``flows.ingest``, ``flows.preprocess`` or ``flows.cache`` for a flow.
"""

from __future__ import annotations

__all__ = ["cache", "cli", "deployments", "ingest", "preprocess"]  # modules: the flows, the CLI, the schedules
