"""The one way to the optional C module ``mmlake.ingest._native`` (``ingest/_native.c``).

:data:`module` is the built module, or None where it was not built (no C compiler or libcrypto at install
time) or is older than this code (an editable install not rebuilt since the C source changed: ``make
install`` rebuilds it). Callers read ``native.module`` at call time and do the same work in Python when it
is None, with the same results; tests set it to None to compare both paths.
"""

from __future__ import annotations

import warnings
from types import ModuleType

from mmlake.ingest.records import Accepted, Checked

#: The API of ``ingest/_native.c`` this code calls (its ``API``).
NATIVE_API = 5


def load() -> ModuleType | None:
    """The native module, configured with the record types it builds, or None (see the module docstring)."""
    try:
        from mmlake.ingest import _native
    except ImportError:
        return None
    if getattr(_native, "API", None) != NATIVE_API:
        warnings.warn(
            f"mmlake.ingest._native is API {getattr(_native, 'API', 1)}, this code needs {NATIVE_API}: "
            "not used (reinstall mmlake to rebuild it)",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    _native.configure(Checked, Accepted)
    return _native


module = load()
