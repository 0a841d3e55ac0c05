"""The errors every mmlake package shares. Each package's own ``errors.py`` subclasses these.

Each class also inherits the built-in it resembles, so ``except ValueError`` still catches bad input.
"""

from __future__ import annotations


class MmlakeError(Exception):
    """Base class of mmlake's errors. The message is one line a user can act on."""


class InputError(MmlakeError, ValueError):
    """A user-supplied file, manifest, argument or table is unusable."""


class CommitConflictError(MmlakeError, RuntimeError):
    """Another writer kept winning the Delta commit race (after every retry, where there are retries).
    Transient: a later run re-plans from the table's new state."""


class CommitRaceLost(CommitConflictError):
    """One Delta commit lost: another writer committed since the snapshot it was planned from.
    Raised by :func:`mmlake.lake.commit`; callers re-plan and retry, or let it through."""
