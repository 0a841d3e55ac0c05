"""ONNX-pinned preprocessing: the operator registry, the operators (image, audio, text), the features
table, incremental runs and backfills; :mod:`mmlake.preprocessing.drift` scores drift over the features.

See docs/preprocessing.md and docs/drift.md. Importing this package loads no model and starts no
ONNX Runtime session: operators open their sessions when first used.
"""

from __future__ import annotations

from mmlake.preprocessing.backfill import run_backfill
from mmlake.preprocessing.errors import (
    DriftStateError,
    OperatorIntegrityError,
    OperatorNotFoundError,
    PreprocessError,
    ProviderUnavailableError,
)
from mmlake.preprocessing.features import FeatureWriter, PreprocessSummary, features_schema
from mmlake.preprocessing.incremental import run_preprocess
from mmlake.preprocessing.registry import OperatorSpec, Registry, load_registry
from mmlake.preprocessing.settings import PreprocessSettings

__all__ = [
    "DriftStateError",
    "FeatureWriter",
    "OperatorIntegrityError",
    "OperatorNotFoundError",
    "OperatorSpec",
    "PreprocessError",
    "PreprocessSettings",
    "PreprocessSummary",
    "ProviderUnavailableError",
    "Registry",
    "features_schema",
    "load_registry",
    "run_backfill",
    "run_preprocess",
]
