"""OpenLineage datasets for what mmlake reads and writes: Kafka topics and Delta tables."""

from __future__ import annotations

from typing import Any

from lineage.naming import kafka_dataset, storage_dataset


def kafka_input(bootstrap: str, topic: str, summary: Any | None = None) -> Any:
    """The topic as an input; with an ingest summary, its offsets and data-quality metrics."""
    from openlineage.client.event_v2 import InputDataset
    from openlineage.client.facet_v2 import data_quality_metrics_input_dataset as dq

    from lineage.facets import MmlakeKafkaInputDatasetFacet

    namespace, name = kafka_dataset(bootstrap, topic)
    facets: dict[str, Any] = {}
    if summary is not None:
        read = summary.accepted + summary.late + summary.duplicates + summary.dead_lettered
        facets["dataQualityMetrics"] = dq.DataQualityMetricsInputDatasetFacet(
            columnMetrics={}, rowCount=read, bytes=summary.payload_bytes)
        facets["mmlake_kafka"] = MmlakeKafkaInputDatasetFacet(
            partitions=[{"partition": p, "firstOffset": a, "lastOffset": b}
                        for p, (a, b) in sorted(summary.offsets.items())],
            recordsRead=read, accepted=summary.accepted, late=summary.late,
            duplicates=summary.duplicates, deadLettered=summary.dead_lettered)
    return InputDataset(namespace=namespace, name=name, inputFacets=facets)


def _table_facets(dt: Any) -> dict[str, Any]:
    from openlineage.client.facet_v2 import dataset_version_dataset, schema_dataset, storage_dataset as storage

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
    return OutputDataset(namespace=namespace, name=name, outputFacets=output_facets,
                         facets=_table_facets(dt) if dt is not None else {})


def delta_input(uri: str, dt: Any | None) -> Any:
    """A Delta table as an input, at the version the run read."""
    from openlineage.client.event_v2 import InputDataset

    namespace, name = storage_dataset(uri)
    return InputDataset(namespace=namespace, name=name, facets=_table_facets(dt) if dt is not None else {})
