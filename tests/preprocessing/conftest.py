"""Generated encoder models are built once per test session into a session folder."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def operator_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """MMLAKE_PREPROCESS_CACHE_DIR for the session (a fresh machine starts with an empty cache too)."""
    path = str(tmp_path_factory.mktemp("operator-cache"))
    previous = os.environ.get("MMLAKE_PREPROCESS_CACHE_DIR")
    os.environ["MMLAKE_PREPROCESS_CACHE_DIR"] = path
    yield path
    if previous is None:
        os.environ.pop("MMLAKE_PREPROCESS_CACHE_DIR", None)
    else:
        os.environ["MMLAKE_PREPROCESS_CACHE_DIR"] = previous


@pytest.fixture(scope="session")
def registry(operator_cache: str):
    from preprocessing.registry import Registry

    return Registry.load(cache_dir=operator_cache)


@pytest.fixture(scope="session")
def cpu_options():
    from preprocessing.runtime import resolve

    return resolve("cpu", 2, "all")
