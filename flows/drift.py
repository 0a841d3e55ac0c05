"""The drift flow: windows over a stream's new features into the drift table, an artifact with a plot,
lineage with data-quality facets. Thin: the work is :mod:`preprocessing.drift.run`."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from flows.preprocess import _is_transient
from ingest import IngestSettings
from lineage import LineageEmitter
from lineage.datasets import delta_input, delta_output
from preprocessing.drift.run import DriftSummary, run_drift
from preprocessing.settings import DriftSettings, PreprocessSettings

#: The most windows one lineage event lists (alarms first, then each metric's last window).
FACET_WINDOWS = 200


def drift_facets(summary: Any) -> dict[str, Any]:
    from lineage.facets import MmlakeDriftRunFacet
    from ingest.engine import format_us

    rows = summary.window_rows
    last: dict[str, dict[str, Any]] = {}
    for r in rows:
        last[r["metric"]] = r
    chosen = [r for r in rows if r["event"] == "raised"] + [r for r in last.values() if r["value"] is not None]
    windows = [{"windowStart": format_us(r["window_start"]), "windowEnd": format_us(r["window_end"]), "metric": r["metric"],
                "value": float(r["value"]), "threshold": None if r["threshold"] is None else float(r["threshold"]),
                "alarm": bool(r["alarm"])} for r in chosen[:FACET_WINDOWS]]
    return {"mmlake_drift": MmlakeDriftRunFacet(windows=windows)}


def _features_input(tables: Any, summary: Any | None) -> Any:
    """The features table as input; after a run, one data-quality assertion per metric (no alarm up)."""
    from openlineage.client.facet_v2 import data_quality_assertions_dataset as dqa

    dataset = delta_input(tables.uri("features"), tables.open("features"))
    if summary is not None and summary.window_rows:
        metrics = sorted({r["metric"] for r in summary.window_rows})
        dataset.facets["dataQualityAssertions"] = dqa.DataQualityAssertionsDatasetFacet(assertions=[
            dqa.Assertion(assertion=f"drift:{m} within its EWMA threshold", success=m not in summary.alarms_up,
                          column="embedding") for m in metrics])
    return dataset


@task(name="score-drift-windows", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=_is_transient)
def drift_task(stream: str, ingest_settings: IngestSettings, settings: DriftSettings, rebuild: bool,
               max_samples: int | None, keep_settings: bool = False) -> DriftSummary:

    summary = run_drift(ingest_settings.lake, stream, settings, storage_options=dict(ingest_settings.storage_options),
                        preprocess=PreprocessSettings(), rebuild=rebuild, max_samples=max_samples,
                        keep_settings=keep_settings)
    get_run_logger().info(summary.line())
    return summary


def _trained(tables: Any) -> bool | None:
    import pyarrow.compute as pc

    dt = tables.open("features")
    if dt is None:
        return None
    col = dt.to_pyarrow_dataset().to_table(columns=["encoder_trained"]).column("encoder_trained")
    return None if len(col) == 0 else bool(pc.all(col).as_py())


@flow(name="drift-stream", log_prints=False)
def drift_stream(stream: str, lake: str | None = None, rebuild: bool = False, max_samples: int | None = None,
                 window: int | None = None, step: int | None = None, reference: int | None = None,
                 warmup: int | None = None, keep_settings: bool = False) -> dict[str, Any]:
    """Score the windows ``<lake>/<stream>``'s new features complete; ``rebuild`` starts over (new
    reference, every window rescored). Unset parameters come from ``MMLAKE_...``."""
    from prefect.runtime import flow_run

    from ingest.tables import StreamTables
    from preprocessing.drift.report import markdown, plot_png

    ingest_settings = IngestSettings().with_overrides(lake=lake)
    settings = DriftSettings().with_overrides(window=window, step=step, reference=reference, warmup=warmup)
    tables = StreamTables(ingest_settings.lake, stream, dict(ingest_settings.storage_options))
    emitter = LineageEmitter(ingest_settings.lake)
    job, run_id = f"drift-stream.{stream}", str(flow_run.id)
    emitter.emit("START", job, run_id, inputs=[_features_input(tables, None)])
    try:
        summary = drift_task(stream, ingest_settings, settings, rebuild, max_samples, keep_settings)
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, inputs=[_features_input(tables, None)], error=err)
        raise
    drift_dt = tables.open("drift")
    emitter.emit("COMPLETE", job, run_id, inputs=[_features_input(tables, summary)],
                 outputs=[delta_output(tables.uri("drift"), drift_dt, summary.rows)],
                 run_facets=drift_facets(summary))
    png = plot_png(_recent_rows(drift_dt), f"drift of {stream}") if drift_dt is not None else None
    trained = _trained(tables)
    create_markdown_artifact(key=f"drift-{stream}".lower().replace("_", "-"),
                             markdown=markdown(summary, png, trained), description=summary.line())
    out = summary.as_dict()
    out["encoder_trained"] = trained
    out["plot"] = _save_plot(ingest_settings.lake, stream, png)
    return out


def _save_plot(lake: str, stream: str, png: bytes | None) -> str | None:
    """On a local lake, the plot also goes to ``<lake>/_plots/drift-<stream>.png``; its path, or None."""
    from pathlib import Path

    if png is None or ("://" in lake and not lake.startswith("file://")):
        return None
    folder = Path(lake.removeprefix("file://")) / "_plots"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"drift-{stream}.png"
    path.write_bytes(png)
    return str(path.resolve())


def _recent_rows(drift_dt: Any, windows: int = 600) -> list[dict[str, Any]]:
    """The drift table's last ``windows`` windows (every metric), timestamps as epoch µs, for the plot."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = drift_dt.to_pyarrow_table(columns=["window_start", "window_end", "first_sample", "metric", "value",
                                               "threshold_low", "threshold_high", "alarm"])
    starts = sorted(set(table.column("first_sample").to_pylist()))
    if not starts:
        return []
    table = table.filter(pc.greater_equal(table.column("first_sample"), starts[-windows:][0]))
    for key in ("window_start", "window_end"):
        table = table.set_column(table.schema.get_field_index(key), key, pc.cast(table.column(key), pa.int64()))
    return table.to_pylist()
