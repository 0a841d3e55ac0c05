"""Prefect flows (thin orchestration over the library packages) and the ``mmlake`` CLI.

Importing this package does not import Prefect; import ``flows.ingest`` for the flow itself.
"""

from __future__ import annotations

__all__ = ["ingest"]
