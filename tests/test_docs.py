"""The docs that users configure from stay true to the code."""

from __future__ import annotations

from pathlib import Path

import pytest

from mmlake.cache.settings import CacheSettings
from mmlake.ingest.settings import IngestSettings
from mmlake.lineage.settings import LineageSettings
from mmlake.preprocessing.drift.settings import DriftSettings
from mmlake.preprocessing.settings import PreprocessSettings
from mmlake.settings import LakeSettings, Settings

ROOT = Path(__file__).parents[1]


@pytest.mark.parametrize(
    ("model", "prefix"),
    [
        (LakeSettings, "MMLAKE_"),
        (IngestSettings, "MMLAKE_"),
        (CacheSettings, "MMLAKE_CACHE_"),
        (LineageSettings, "MMLAKE_LINEAGE_"),
        (PreprocessSettings, "MMLAKE_PREPROCESS_"),
        (DriftSettings, "MMLAKE_DRIFT_"),
    ],
)
def test_every_setting_is_documented_with_its_default(model, prefix) -> None:
    text = (ROOT / "docs" / "configuration.md").read_text()
    for name, field in model.model_fields.items():
        variable = f"{prefix}{name.upper()}"
        assert f"`{variable}`" in text, f"{variable} is not in docs/configuration.md"
        assert field.description, f"{name} has no description"
        default = field.get_default(call_default_factory=True)
        row = next(line for line in text.splitlines() if line.startswith(f"| `{variable}`"))
        shown = "{}" if default == {} else str(default)
        assert f"`{shown}`" in row or (isinstance(default, float) and f"`{default:g}`" in row), (
            f"{variable}: default {default!r} not shown in its row"
        )


def test_readme_names_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert "make demo" in text and "make test" in text
    makefile = (ROOT / "Makefile").read_text()
    assert "\ndemo:" in makefile and "\ntest:" in makefile


def test_every_subsystem_reads_its_settings_through_the_one_base(monkeypatch) -> None:
    for model in (LakeSettings, IngestSettings, CacheSettings, LineageSettings, PreprocessSettings, DriftSettings):
        assert issubclass(model, Settings), model
    monkeypatch.setenv("MMLAKE_LAKE", "/from/env")
    ingest = IngestSettings()
    assert isinstance(ingest, LakeSettings) and ingest.lake == "/from/env" == LakeSettings().lake
    moved = ingest.with_overrides(lake="/given", kafka_bootstrap=None)
    assert (moved.lake, moved.kafka_bootstrap) == ("/given", ingest.kafka_bootstrap)
    assert ingest.with_overrides(lake=None) is ingest
