"""OpenLineage datasets for what mmlake reads and writes: Kafka topics and Delta tables."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from mmlake.lake import StreamTables
from mmlake.lineage.naming import kafka_dataset, storage_dataset


def kafka_input(bootstrap: str, topic: str, summary: Any | None = None) -> Any:
    """The topic as an input; with an ingest summary, its offsets and data-quality metrics."""
    from openlineage.client.event_v2 import InputDataset
    from openlineage.client.facet_v2 import data_quality_metrics_input_dataset as dq

    from mmlake.lineage.facets import MmlakeKafkaInputDatasetFacet

    namespace, name = kafka_dataset(bootstrap, topic)
    facets: dict[str, Any] = {}
    if summary is not None:
        read = summary.accepted + summary.late + summary.duplicates + summary.dead_lettered
        facets["dataQualityMetrics"] = dq.DataQualityMetricsInputDatasetFacet(
            columnMetrics={}, rowCount=read, bytes=summary.payload_bytes
        )
        facets["mmlake_kafka"] = MmlakeKafkaInputDatasetFacet(
            partitions=[
                {"partition": p, "firstOffset": a, "lastOffset": b} for p, (a, b) in sorted(summary.offsets.items())
            ],
            recordsRead=read,
            accepted=summary.accepted,
            late=summary.late,
            duplicates=summary.duplicates,
            deadLettered=summary.dead_lettered,
        )
    return InputDataset(namespace=namespace, name=name, inputFacets=facets)


def _table_facets(dt: Any) -> dict[str, Any]:
    from openlineage.client.facet_v2 import dataset_version_dataset, schema_dataset
    from openlineage.client.facet_v2 import storage_dataset as storage

    arrow = dt.schema().to_arrow()
    fields = [schema_dataset.SchemaDatasetFacetFields(name=f.name, type=str(f.type)) for f in arrow]
    return {
        "schema": schema_dataset.SchemaDatasetFacet(fields=fields),
        "version": dataset_version_dataset.DatasetVersionDatasetFacet(datasetVersion=str(dt.version())),
        "storage": storage.StorageDatasetFacet(storageLayer="delta", fileFormat="parquet"),
    }


def delta_output(uri: str, dt: Any | None, rows: int | None = None, size: int | None = None) -> Any:
    """A Delta table as an output, at the version the run left it (``dt`` None: name only)."""
    from openlineage.client.event_v2 import OutputDataset
    from openlineage.client.facet_v2 import output_statistics_output_dataset as stats

    namespace, name = storage_dataset(uri)
    output_facets: dict[str, Any] = {}
    if rows is not None:
        output_facets["outputStatistics"] = stats.OutputStatisticsOutputDatasetFacet(rowCount=rows, size=size)
    return OutputDataset(
        namespace=namespace, name=name, outputFacets=output_facets, facets=_table_facets(dt) if dt is not None else {}
    )


def delta_input(uri: str, dt: Any | None) -> Any:
    """A Delta table as an input, at the version the run read."""
    from openlineage.client.event_v2 import InputDataset

    namespace, name = storage_dataset(uri)
    return InputDataset(namespace=namespace, name=name, facets=_table_facets(dt) if dt is not None else {})


def table_outputs(
    tables: StreamTables,
    names: Iterable[str],
    rows: Mapping[str, int] | None = None,
    sizes: Mapping[str, int] | None = None,
    *,
    existing_only: bool = False,
) -> list[Any]:
    """Tables of a stream as outputs at their current versions, with the rows (and bytes) the run
    wrote to each where given; ``existing_only`` leaves out tables that do not exist."""
    out = []
    for name in names:
        dt = tables.open(name)
        if dt is None and existing_only:
            continue
        out.append(delta_output(tables.uri(name), dt, (rows or {}).get(name), (sizes or {}).get(name)))
    return out


def table_inputs(tables: StreamTables, names: Iterable[str], *, existing_only: bool = False) -> list[Any]:
    """Tables of a stream as inputs at their current versions (a missing one by name only);
    ``existing_only`` leaves out tables that do not exist."""
    out = []
    for name in names:
        dt = tables.open(name)
        if dt is not None or not existing_only:
            out.append(delta_input(tables.uri(name), dt))
    return out


def with_drift_assertions(dataset: Any, metrics: Iterable[str], alarms: Iterable[str]) -> Any:
    """``dataset`` (the features input of a drift run) with one data-quality assertion per metric:
    it holds when the metric has no alarm up."""
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dqa

    up = set(alarms)
    dataset.facets["dataQualityAssertions"] = dqa.DataQualityAssertionsDatasetFacet(
        assertions=[
            dqa.Assertion(assertion=f"drift:{m} within its EWMA threshold", success=m not in up, column="embedding")
            for m in sorted(set(metrics))
        ]
    )
    return dataset
