"""Errors of the ingest package. Each also inherits the built-in it resembles.

Bad input and lost commit races are the shared :class:`mmlake.errors.InputError` and
:class:`mmlake.errors.CommitConflictError`.
"""

from __future__ import annotations

from mmlake.errors import MmlakeError


class IngestError(MmlakeError):
    """Base class of ingest errors."""


class BrokerUnavailableError(IngestError, ConnectionError):
    """Kafka could not be reached (at start, or it went away mid-run). Transient: a retry is safe."""


class BrokerStartError(IngestError, RuntimeError):
    """The embedded broker binary could not be found or did not come up."""


class TopicNotFoundError(IngestError, LookupError):
    """The topic does not exist on the cluster."""
