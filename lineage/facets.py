"""mmlake's custom OpenLineage facets. Each has a JSON Schema in ``lineage/schemas/`` whose ``$id`` is
the facet's ``_schemaURL``; names are prefixed ``mmlake_``."""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

from mmlake.lake import format_us

SCHEMA_BASE = "https://mmlake.dev/spec/facets/1-0-0"
#: The most drift windows one lineage event lists (alarms first, then each metric's last window).
FACET_WINDOWS = 200


def schema_url(name: str) -> str:
    return f"{SCHEMA_BASE}/{name}.json#/$defs/{name}"


@attr.define
class MmlakeKafkaInputDatasetFacet(InputDatasetFacet):
    """Offsets read per partition and what became of the records (``mmlake_kafka``)."""

    partitions: list[dict[str, int]] = attr.field(factory=list)
    recordsRead: int = 0
    accepted: int = 0
    late: int = 0
    duplicates: int = 0
    deadLettered: int = 0

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


def operators_run_facets(operators: list[dict[str, Any]], runtime: dict[str, Any]) -> dict[str, Any]:
    """``mmlake_onnx_operators`` for a preprocessing run: every model of every operator, with the ONNX
    Runtime version and execution provider (``operators`` and ``runtime`` as a run summary lists them)."""
    models = []
    for op in operators:
        for m in op["models"]:
            models.append(
                {
                    "name": m["name"],
                    "version": m["version"],
                    "sha256": m["sha256"],
                    "opset": m["opset"],
                    "ortVersion": runtime["ort_version"],
                    "executionProvider": m["provider"] or runtime["provider"],
                }
            )
    return {"mmlake_onnx_operators": MmlakeOnnxOperatorsRunFacet(operators=models)}


def drift_run_facets(window_rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``mmlake_drift`` for a drift run: the windows that raised an alarm, then each metric's last
    scored window, at most :data:`FACET_WINDOWS` (rows as the drift table holds them, times in µs)."""
    last: dict[str, dict[str, Any]] = {}
    for r in window_rows:
        last[r["metric"]] = r
    chosen = [r for r in window_rows if r["event"] == "raised"] + [r for r in last.values() if r["value"] is not None]
    windows = [
        {
            "windowStart": format_us(r["window_start"]),
            "windowEnd": format_us(r["window_end"]),
            "metric": r["metric"],
            "value": float(r["value"]),
            "threshold": None if r["threshold"] is None else float(r["threshold"]),
            "alarm": bool(r["alarm"]),
        }
        for r in chosen[:FACET_WINDOWS]
    ]
    return {"mmlake_drift": MmlakeDriftRunFacet(windows=windows)}
