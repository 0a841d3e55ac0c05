"""The drift flow: windows over a stream's new features into the drift table, an artifact with a plot,
lineage with data-quality facets. Thin: the work is :mod:`mmlake.preprocessing.drift`."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from mmlake.flows.retry import commit_is_transient
from mmlake.flows.stages import artifact_key
from mmlake.lake import StreamTables
from mmlake.lineage import LineageEmitter
from mmlake.lineage.datasets import table_inputs, table_outputs, with_drift_assertions
from mmlake.lineage.facets import drift_run_facets
from mmlake.preprocessing.drift.report import DriftResult, report
from mmlake.preprocessing.drift.run import DriftSummary, run_drift
from mmlake.preprocessing.drift.settings import DriftSettings, ReferenceRange
from mmlake.preprocessing.settings import PreprocessSettings
from mmlake.settings import LakeSettings


def _features_input(tables: StreamTables, summary: DriftSummary | None) -> Any:
    """The features table as input; after a run, one data-quality assertion per metric (no alarm up)."""
    (dataset,) = table_inputs(tables, ["features"])
    if summary is not None and summary.window_rows:
        with_drift_assertions(dataset, (r["metric"] for r in summary.window_rows), summary.alarms_up)
    return dataset


@task(name="score-drift-windows", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=commit_is_transient)
def drift_task(
    stream: str,
    lake: LakeSettings,
    settings: DriftSettings,
    rebuild: bool,
    max_samples: int | None,
    keep_settings: bool = False,
    reference: ReferenceRange | None = None,
) -> DriftSummary:
    reference = reference or ReferenceRange()
    summary = run_drift(
        lake.lake,
        stream,
        settings,
        storage_options=dict(lake.storage_options),
        preprocess=PreprocessSettings(),
        rebuild=rebuild,
        max_samples=max_samples,
        keep_settings=keep_settings,
        reference_range=reference.bounds_us(),
        reference_first=reference.first,
    )
    get_run_logger().info(summary.line())
    return summary


@flow(name="drift-stream", log_prints=False)
def drift_stream(
    stream: str,
    lake: LakeSettings | None = None,
    settings: DriftSettings | None = None,
    rebuild: bool = False,
    max_samples: int | None = None,
    keep_settings: bool = False,
    reference: ReferenceRange | None = None,
) -> DriftResult:
    """Score the windows ``<lake>/<stream>``'s new features complete; ``rebuild`` starts over (every
    window rescored). The reference is the stream's first ``settings.reference`` samples, or the range
    ``reference`` names; a rebuild keeps the one the codebooks were fitted on unless given another
    (``reference.first``: back to the first samples). Unset settings come from ``MMLAKE_...``."""
    from prefect.runtime import flow_run

    lake = lake or LakeSettings()
    reference = reference or ReferenceRange()
    reference.bounds_us()  # a bad range fails here, in one line, before any lineage event
    tables = lake.tables(stream)
    with LineageEmitter.for_lake(lake).run(
        f"drift-stream.{stream}", str(flow_run.id), inputs=lambda: [_features_input(tables, None)]
    ) as run:
        summary = drift_task(stream, lake, settings or DriftSettings(), rebuild, max_samples, keep_settings, reference)
        run.complete(
            inputs=[_features_input(tables, summary)],
            outputs=table_outputs(tables, ["drift"], {"drift": summary.rows}),
            run_facets=drift_run_facets(summary.window_rows),
        )
    shown = report(tables, summary)
    create_markdown_artifact(key=artifact_key("drift", stream), markdown=shown.markdown, description=summary.line())
    return DriftResult.of(summary, shown)
