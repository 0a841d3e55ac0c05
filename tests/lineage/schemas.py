"""Validation of emitted events against the vendored OpenLineage JSON Schemas and our own."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012

REPO = Path(__file__).parents[2]
#: The OpenLineage spec vendored beside this file (licence and origin in its SOURCE.md); another copy
#: (a newer spec, say) through MMLAKE_OPENLINEAGE_SPEC.
SPEC = Path(os.environ.get("MMLAKE_OPENLINEAGE_SPEC", Path(__file__).parent / "openlineage"))
SPEC_PRESENT = (SPEC / "OpenLineage.json").exists()
MISSING = f"the vendored OpenLineage spec is not at {SPEC} (set MMLAKE_OPENLINEAGE_SPEC)"


def _registry() -> Registry:
    if not SPEC_PRESENT:
        return Registry()
    docs = [json.loads(p.read_text()) for p in [SPEC / "OpenLineage.json", *sorted((SPEC / "facets").glob("*.json"))]]
    docs += [json.loads(p.read_text()) for p in sorted((REPO / "lineage" / "schemas").glob("*.json"))]
    return Registry().with_resources(
        (doc["$id"], Resource.from_contents(doc, default_specification=DRAFT202012)) for doc in docs
    )


REGISTRY = _registry()
CORE = Draft202012Validator(
    {"$ref": "https://openlineage.io/spec/2-0-2/OpenLineage.json"}, registry=REGISTRY, format_checker=FormatChecker()
)


def facets_of(event: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found = []
    found += list((event["run"].get("facets") or {}).items())
    found += list((event["job"].get("facets") or {}).items())
    for ds in (event.get("inputs") or []) + (event.get("outputs") or []):
        for group in ("facets", "inputFacets", "outputFacets"):
            found += list((ds.get(group) or {}).items())
    return found


def validate_event(event: dict[str, Any]) -> None:
    """The event against the core schema, then each facet against the schema its ``_schemaURL`` names.
    Skips the calling test (with the reason) where the spec is not beside the repository."""
    if not SPEC_PRESENT:
        import pytest

        pytest.skip(MISSING)
    CORE.validate(event)
    for name, facet in facets_of(event):
        url = facet["_schemaURL"]
        assert url.startswith(("https://openlineage.io/spec/facets/", "https://mmlake.dev/spec/facets/")), url
        if url.startswith("https://mmlake.dev/"):
            assert name.startswith("mmlake_"), name
        Draft202012Validator({"$ref": url}, registry=REGISTRY, format_checker=FormatChecker()).validate(facet)
