"""mmlake: shared roots of the project (version and the root exception).

The working packages are top-level siblings: ``ingest``, ``preprocessing``, ``lineage``, ``cache``
and ``flows``. This package holds only what all of them share.
"""

from __future__ import annotations

from mmlake.errors import MmlakeError

__version__ = "0.1.0"

__all__ = ["MmlakeError", "__version__"]
