"""Errors of the preprocessing package."""

from __future__ import annotations

from mmlake.errors import MmlakeError


class PreprocessError(MmlakeError):
    """Base class of preprocessing errors."""


class OperatorIntegrityError(PreprocessError, RuntimeError):
    """An operator file's bytes do not match the SHA-256 recorded for it: nothing runs."""


class OperatorNotFoundError(PreprocessError, LookupError):
    """No operator (or model) of that name and version is registered."""


class ProviderUnavailableError(PreprocessError, RuntimeError):
    """The execution provider asked for is not available here (there is no silent fallback)."""


class DriftStateError(PreprocessError, RuntimeError):
    """The drift table's pinned state (codebook, operators, settings) does not match this run."""
