"""The root of every exception mmlake raises on purpose."""

from __future__ import annotations


class MmlakeError(Exception):
    """Base class of mmlake's errors. The message is one line a user can act on."""
