"""mmlake's custom OpenLineage facets. Each has a JSON Schema in ``lineage/schemas/`` whose ``$id`` is
the facet's ``_schemaURL``; names are prefixed ``mmlake_``."""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

SCHEMA_BASE = "https://mmlake.dev/spec/facets/1-0-0"


def schema_url(name: str) -> str:
    return f"{SCHEMA_BASE}/{name}.json#/$defs/{name}"


@attr.define
class MmlakeKafkaInputDatasetFacet(InputDatasetFacet):
    """Offsets read per partition and what became of the records (``mmlake_kafka``)."""

    partitions: list[dict[str, int]] = attr.field(factory=list)
    recordsRead: int = 0  # noqa: N815
    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    deadLettered: int = 0  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return schema_url("MmlakeKafkaInputDatasetFacet")


@attr.define
class MmlakeOnnxOperatorsRunFacet(RunFacet):
    """The ONNX operators a run executed (``mmlake_onnx_operators``)."""

    operators: list[dict[str, Any]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("MmlakeOnnxOperatorsRunFacet")


@attr.define
class MmlakeDriftRunFacet(RunFacet):
    """Drift windows a run evaluated (``mmlake_drift``)."""

    windows: list[dict[str, Any]] = attr.field(factory=list)

    @staticmethod
    def _get_schema() -> str:
        return schema_url("MmlakeDriftRunFacet")
