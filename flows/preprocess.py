"""The preprocessing and backfill flows: raw rows through the ONNX operators into the features table.

Both are thin: the work is :mod:`mmlake.preprocessing.incremental` and
:mod:`mmlake.preprocessing.backfill`, exactly-once through the Delta log, so a retried task resumes
where the failed attempt's last commit left off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from mmlake.flows.retry import commit_is_transient
from mmlake.flows.stages import BackfillPlan, artifact_key, backfill_run_name
from mmlake.lineage import LineageEmitter, static_run_id
from mmlake.lineage.datasets import table_inputs, table_outputs
from mmlake.lineage.facets import operators_run_facets
from mmlake.preprocessing.backfill import run_backfill
from mmlake.preprocessing.drift.report import DriftResult
from mmlake.preprocessing.features import PreprocessSummary
from mmlake.preprocessing.incremental import run_preprocess
from mmlake.preprocessing.settings import PreprocessSettings
from mmlake.settings import LakeSettings

#: Called with (rows done, rows in all) for backfills, (feature rows committed so far, 0) after each
#: commit of an incremental run (its total is not known ahead).
Progress = Callable[[int, int], None]


def _outputs(lake: LakeSettings, stream: str, summary: PreprocessSummary) -> list[Any]:
    return table_outputs(lake.tables(stream), ["features"], {"features": summary.rows})


@dataclass(frozen=True)
class PreprocessResult:
    """What a preprocessing run wrote, and the drift run after it (``then_drift``)."""

    summary: PreprocessSummary
    drift: DriftResult | None = None

    def lines(self) -> list[str]:
        """The summary lines the CLI prints."""
        return [self.summary.line()] + ([self.drift.line()] if self.drift is not None else [])


@task(
    name="compute-features",
    retries=2,
    retry_delay_seconds=[2, 10],
    retry_condition_fn=commit_is_transient,
    cache_policy=NO_CACHE,
)  # takes callbacks; results are never reused anyway
def features_task(
    stream: str,
    lake: LakeSettings,
    settings: PreprocessSettings,
    operators: list[str] | None,
    max_rows: int | None,
    backfill: BackfillPlan | None = None,
    lineage_parent: tuple[str, str] | None = None,
    cancel: Any = None,
    progress: Progress | None = None,
) -> PreprocessSummary:
    from prefect.runtime import task_run

    logger = get_run_logger()
    job = f"{lineage_parent[0]}.compute-features" if lineage_parent else f"preprocess-stream.{stream}.task"
    run_id = str(task_run.id) if backfill is None else backfill_run_id(job, backfill)
    tables = lake.tables(stream)
    with LineageEmitter.for_lake(lake).run(
        job, run_id, job_type="TASK", parent=lineage_parent, inputs=lambda: table_inputs(tables, ["raw"])
    ) as run:
        if backfill is None:

            def committed(so_far: PreprocessSummary) -> None:
                logger.info("%d rows committed so far", so_far.rows)
                if progress is not None:
                    progress(so_far.rows, 0)

            summary = run_preprocess(
                lake.lake,
                stream,
                settings,
                storage_options=dict(lake.storage_options),
                operators=operators,
                max_rows=max_rows,
                run_id=run_id,
                stop=cancel,
                on_commit=committed,
            )
        else:
            plan = backfill

            def advanced(done: int, total: int) -> None:
                logger.info("backfill %s..%s: %d/%d raw rows", plan.start, plan.end, done, total)
                if progress is not None:
                    progress(done, total)

            summary = run_backfill(
                lake.lake,
                stream,
                plan.start,
                plan.end,
                settings,
                operator=plan.operator,
                force=plan.force,
                storage_options=dict(lake.storage_options),
                run_id=run_id,
                on_progress=advanced,
            )
        logger.info(summary.line())
        run.complete(
            outputs=_outputs(lake, stream, summary), run_facets=operators_run_facets(summary.operators, summary.runtime)
        )
    return summary


def backfill_run_id(job: str, plan: BackfillPlan) -> str:
    """The lineage run id of a backfill of the plan's range: the same for every rerun of the same range."""
    from datetime import UTC, datetime

    lo, hi = plan.bounds_us()
    return static_run_id(job, datetime.fromtimestamp(lo / 1e6, UTC), datetime.fromtimestamp(hi / 1e6, UTC))


def _run(
    job: str,
    stream: str,
    lake: LakeSettings,
    settings: PreprocessSettings,
    operators: list[str] | None,
    max_rows: int | None,
    backfill: BackfillPlan | None,
    artifact_key: str,
    cancel: Any,
    progress: Progress | None,
) -> PreprocessSummary:
    from prefect.runtime import flow_run

    run_id = str(flow_run.id) if backfill is None else backfill_run_id(job, backfill)
    tables = lake.tables(stream)
    with LineageEmitter.for_lake(lake).run(job, run_id, inputs=lambda: table_inputs(tables, ["raw"])) as run:
        summary = features_task(stream, lake, settings, operators, max_rows, backfill, (job, run_id), cancel, progress)
        run.complete(
            outputs=_outputs(lake, stream, summary), run_facets=operators_run_facets(summary.operators, summary.runtime)
        )
    create_markdown_artifact(key=artifact_key, markdown=summary_markdown(summary), description=summary.line())
    return summary


@flow(name="preprocess-stream", log_prints=False)
def preprocess_stream(
    stream: str,
    lake: LakeSettings | None = None,
    settings: PreprocessSettings | None = None,
    operators: list[str] | None = None,
    max_rows: int | None = None,
    then_drift: bool = False,
    cancel: Any = None,
    progress: Any = None,
) -> PreprocessResult:
    """Compute the features rows ``<lake>/<stream>`` is missing, with the default operator of each
    modality (or the given ``operators``, NAME@VERSION); with ``then_drift``, run the drift flow on the
    stream afterwards (a subflow). Unset settings come from ``MMLAKE_...``. In-process runs may pass
    ``cancel`` (a ``threading.Event``: the run stops after its current commit) and ``progress`` (called
    with the rows committed so far, and 0)."""
    lake = lake or LakeSettings()
    summary = _run(
        f"preprocess-stream.{stream}",
        stream,
        lake,
        settings or PreprocessSettings(),
        operators,
        max_rows,
        None,
        artifact_key("preprocess", stream),
        cancel,
        progress,
    )
    if not then_drift:
        return PreprocessResult(summary)
    from mmlake.flows.drift import drift_stream

    return PreprocessResult(summary, drift_stream(stream=stream, lake=lake))


@flow(name="backfill-features", flow_run_name=partial(backfill_run_name, with_stages=False), log_prints=False)
def backfill_features(
    stream: str,
    plan: BackfillPlan,
    lake: LakeSettings | None = None,
    settings: PreprocessSettings | None = None,
    progress: Any = None,
) -> PreprocessSummary:
    """Recompute the features of the plan's range (with its ``operator``: only that operator's
    modality). A range already computed by the same operator bytes is left alone unless the plan says
    ``force``. In-process runs may pass ``progress``, called with (raw rows done, in all)."""
    return _run(
        f"backfill-features.{stream}",
        stream,
        lake or LakeSettings(),
        settings or PreprocessSettings(),
        None,
        None,
        plan,
        artifact_key("backfill", stream),
        None,
        progress,
    )


def summary_markdown(summary: PreprocessSummary) -> str:
    lines = [
        f"### Features of `{summary.stream}`",
        "",
        "| | |",
        "|---|---|",
        f"| rows written | {summary.rows} |",
        f"| rows with errors | {summary.errors} |",
        f"| commits | {summary.commits} |",
        f"| ranges already up to date | {summary.skipped_ranges} |",
        f"| execution provider | {summary.runtime.get('provider')} |",
        f"| ONNX Runtime | {summary.runtime.get('ort_version')} |",
        f"| intra-op threads | {summary.runtime.get('intra_op_threads')} |",
        "",
        "| operator | SHA-256 | trained | rows |",
        "|---|---|---|---|",
    ]
    for op in summary.operators:
        ref = f"{op['name']}@{op['version']}"
        trained = "yes" if op["trained"] else "**no (seeded, untrained)**"
        lines.append(f"| {ref} | `{op['sha256'][:16]}` | {trained} | {summary.by_operator.get(ref, 0)} |")
    return "\n".join(lines)
