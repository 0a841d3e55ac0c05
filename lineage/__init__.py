"""OpenLineage emission and the local lineage query (not built yet).

See ../shared/design/ARCHITECTURE.md, "Lineage".
"""

from __future__ import annotations

__all__: list[str] = []
