"""Errors of the ingest package. Each also inherits the built-in it resembles."""

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


class CommitConflictError(IngestError, RuntimeError):
    """Another writer kept winning the Delta commit race after every retry."""


class InputError(IngestError, ValueError):
    """A user-supplied file, manifest or argument is unusable."""
