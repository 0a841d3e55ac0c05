"""Registry and runtime options shared by the preprocessing tests (the operator cache folder is the
session-wide ``operator_cache`` fixture of tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def registry(operator_cache: str):
    from mmlake.preprocessing.registry import Registry

    return Registry.load(cache_dir=operator_cache)


@pytest.fixture(scope="session")
def cpu_options():
    from mmlake.preprocessing.runtime import resolve

    return resolve("cpu", 2, "all")
