"""SafeCache: LSH-keyed, FAISS-backed KV cache for inference servers (not built yet).

See ../shared/design/ARCHITECTURE.md, "SafeCache HTTP API (v1)".
"""

from __future__ import annotations

__all__: list[str] = []
