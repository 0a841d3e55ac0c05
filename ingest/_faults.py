"""Crash points for fault-injection tests.

Setting ``MMLAKE_FAULT_KILL_AT=<point>[:<n>]`` makes the process SIGKILL itself the n-th time (default
first) it reaches that point: the same as ``kill -9`` at the worst moment, but repeatable. Unset, this
costs one dictionary lookup.
"""

from __future__ import annotations

import os
import signal

_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    spec = os.environ.get("MMLAKE_FAULT_KILL_AT")
    if not spec:
        return
    point, _, nth = spec.rpartition(":")
    if not nth.isdigit():
        point, nth = spec, "1"
    if point != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(nth):
        os.kill(os.getpid(), signal.SIGKILL)
