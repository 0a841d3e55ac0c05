"""ONNX-pinned preprocessing operators, CLIP encoders and drift detectors (``preprocessing.drift``).

See ../shared/design/ARCHITECTURE.md, "Preprocessing operators" and "Drift".
"""

from __future__ import annotations

__all__: list[str] = []
