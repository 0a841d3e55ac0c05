"""Prefect flows (thin orchestration over the library packages), their deployments and the ``mmlake`` CLI.

Importing this package does not import Prefect; import a flow's module for the flow:
``mmlake.flows.ingest``, ``.preprocess``, ``.drift``, ``.backfill``, ``.pipeline`` or ``.cache``.
"""

from __future__ import annotations

#: The modules: the flows, the CLI, the schedules, and what several of them share.
__all__ = [
    "backfill",
    "cache",
    "cli",
    "demo",
    "deployments",
    "drift",
    "ingest",
    "pipeline",
    "preprocess",
    "retry",
    "stages",
]
