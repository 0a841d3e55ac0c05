"""The drift flow: windows over a stream's new features into the drift table, an artifact with a plot,
lineage with data-quality facets. Thin: the work is :mod:`mmlake.preprocessing.drift`."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from mmlake.flows.retry import commit_is_transient
from mmlake.errors import InputError
from mmlake.lake import StreamTables, time_range
from mmlake.lineage import LineageEmitter
from mmlake.lineage.datasets import table_inputs, table_outputs, with_drift_assertions
from mmlake.lineage.facets import drift_run_facets
from mmlake.preprocessing.drift.report import report
from mmlake.preprocessing.drift.run import DriftSummary, run_drift
from mmlake.preprocessing.drift.settings import DriftSettings
from mmlake.preprocessing.settings import PreprocessSettings
from mmlake.settings import LakeSettings


def _features_input(tables: StreamTables, summary: DriftSummary | None) -> Any:
    """The features table as input; after a run, one data-quality assertion per metric (no alarm up)."""
    (dataset,) = table_inputs(tables, ["features"])
    if summary is not None and summary.window_rows:
        with_drift_assertions(dataset, (r["metric"] for r in summary.window_rows), summary.alarms_up)
    return dataset


def reference_choice(reference_from: str | None, reference_to: str | None) -> tuple[int, int] | None:
    """The reference range ``[from, to)`` as epoch µs (both given or neither; one-line errors)."""
    if reference_from is None and reference_to is None:
        return None
    if reference_from is None or reference_to is None:
        raise InputError("a reference range needs both --reference-from and --reference-to")
    return time_range(reference_from, reference_to, requirement="--reference-from must be before --reference-to")


@task(name="score-drift-windows", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=commit_is_transient)
def drift_task(stream: str, lake: LakeSettings, settings: DriftSettings, rebuild: bool,
               max_samples: int | None, keep_settings: bool = False,
               reference_range: tuple[int, int] | None = None, reference_first: bool = False) -> DriftSummary:
    summary = run_drift(lake.lake, stream, settings, storage_options=dict(lake.storage_options),
                        preprocess=PreprocessSettings(), rebuild=rebuild, max_samples=max_samples,
                        keep_settings=keep_settings, reference_range=reference_range,
                        reference_first=reference_first)
    get_run_logger().info(summary.line())
    return summary


@flow(name="drift-stream", log_prints=False)
def drift_stream(stream: str, lake: str | None = None, rebuild: bool = False, max_samples: int | None = None,
                 window: int | None = None, step: int | None = None, reference: int | None = None,
                 warmup: int | None = None, keep_settings: bool = False, reference_from: str | None = None,
                 reference_to: str | None = None, reference_first: bool = False) -> dict[str, Any]:
    """Score the windows ``<lake>/<stream>``'s new features complete; ``rebuild`` starts over (every
    window rescored). The reference is the stream's first ``reference`` samples, or those with
    ``reference_from <= event_time < reference_to`` (RFC 3339 or epoch ms); a rebuild keeps the one the
    codebooks were fitted on unless given another (``reference_first``: back to the first samples).
    Unset parameters come from ``MMLAKE_...``."""
    from prefect.runtime import flow_run

    chosen = reference_choice(reference_from, reference_to)
    lake_settings = LakeSettings().with_overrides(lake=lake)
    settings = DriftSettings().with_overrides(window=window, step=step, reference=reference, warmup=warmup)
    tables = lake_settings.tables(stream)
    with LineageEmitter.for_lake(lake_settings).run(f"drift-stream.{stream}", str(flow_run.id),
                                                inputs=lambda: [_features_input(tables, None)]) as run:
        summary = drift_task(stream, lake_settings, settings, rebuild, max_samples, keep_settings, chosen,
                             reference_first)
        run.complete(inputs=[_features_input(tables, summary)],
                     outputs=table_outputs(tables, ["drift"], {"drift": summary.rows}),
                     run_facets=drift_run_facets(summary.window_rows))
    shown = report(tables, summary)
    create_markdown_artifact(key=f"drift-{stream}".lower().replace("_", "-"), markdown=shown.markdown,
                             description=summary.line())
    out = summary.as_dict()
    out["encoder_trained"] = shown.encoder_trained
    out["untrained_modalities"] = list(shown.untrained)
    out["plot"] = shown.plot
    return out
