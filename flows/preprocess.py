"""The preprocessing and backfill flows: raw rows through the ONNX operators into the features table.

Both are thin: the work is :mod:`preprocessing.features`, exactly-once through the Delta log, so a
retried task resumes where the failed attempt's last commit left off.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact

from ingest import CommitConflictError, IngestSettings
from lineage import LineageEmitter
from lineage.datasets import delta_input, delta_output
from preprocessing.features import PreprocessSummary, run_backfill, run_preprocess
from preprocessing.settings import PreprocessSettings

#: Set by the CLI's signal handler: the run stops after its current commit.
STOP = threading.Event()
#: Set by the CLI or the demo to draw a progress bar: called with (rows done, rows in all) for backfills,
#: (feature rows committed so far, 0) after each commit of an incremental run.
PROGRESS: list[Callable[[int, int], None]] = []


def _is_transient(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except CommitConflictError:
        return True
    except Exception:
        return False
    return False


def _lineage(settings: IngestSettings, stream: str) -> tuple[Callable[[], list[Any]], Callable[..., list[Any]]]:
    from ingest.tables import StreamTables

    tables = StreamTables(settings.lake, stream, dict(settings.storage_options))

    def inputs() -> list[Any]:
        return [delta_input(tables.uri("raw"), tables.open("raw"))]

    def outputs(summary: PreprocessSummary | None = None) -> list[Any]:
        return [delta_output(tables.uri("features"), tables.open("features"), summary.rows if summary else None)]

    return inputs, outputs


def _operators_facet(summary: PreprocessSummary) -> dict[str, Any]:
    from lineage.facets import MmlakeOnnxOperatorsRunFacet

    models = []
    for op in summary.operators:
        for m in op["models"]:
            models.append({"name": m["name"], "version": m["version"], "sha256": m["sha256"], "opset": m["opset"],
                           "ortVersion": summary.runtime["ort_version"],
                           "executionProvider": m["provider"] or summary.runtime["provider"]})
    return {"mmlake_onnx_operators": MmlakeOnnxOperatorsRunFacet(operators=models)}


@task(name="compute-features", retries=2, retry_delay_seconds=[2, 10], retry_condition_fn=_is_transient)
def features_task(stream: str, ingest_settings: IngestSettings, settings: PreprocessSettings,
                  operators: list[str] | None, max_rows: int | None,
                  backfill: tuple[str, str, str | None, bool] | None = None,
                  lineage_parent: tuple[str, str] | None = None) -> PreprocessSummary:
    from prefect.runtime import task_run

    logger = get_run_logger()
    emitter = LineageEmitter(ingest_settings.lake)
    job = f"{lineage_parent[0]}.compute-features" if lineage_parent else f"preprocess-stream.{stream}.task"
    run_id = str(task_run.id) if backfill is None else _static_id(job, backfill[0], backfill[1])
    inputs, outputs = _lineage(ingest_settings, stream)
    emitter.emit("START", job, run_id, job_type="TASK", parent=lineage_parent, inputs=inputs())
    options = dict(ingest_settings.storage_options)
    try:
        if backfill is None:
            def committed(so_far: PreprocessSummary) -> None:
                logger.info("%d rows committed so far", so_far.rows)
                for hook in PROGRESS:
                    hook(so_far.rows, 0)  # 0: the total is not known ahead in an incremental run

            summary = run_preprocess(ingest_settings.lake, stream, settings, storage_options=options,
                                     operators=operators, max_rows=max_rows, run_id=run_id, stop=STOP,
                                     on_commit=committed)
        else:
            start, end, operator, force = backfill

            def progress(done: int, total: int) -> None:
                logger.info("backfill %s..%s: %d/%d raw rows", start, end, done, total)
                for hook in PROGRESS:
                    hook(done, total)

            summary = run_backfill(ingest_settings.lake, stream, start, end, settings, operator=operator,
                                   force=force, storage_options=options, run_id=run_id, on_progress=progress)
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, job_type="TASK", parent=lineage_parent, inputs=inputs(), error=err)
        raise
    logger.info(summary.line())
    emitter.emit("COMPLETE", job, run_id, job_type="TASK", parent=lineage_parent, inputs=inputs(),
                 outputs=outputs(summary), run_facets=_operators_facet(summary))
    return summary


def _static_id(job: str, start: str, end: str) -> str:
    """The lineage run id of a backfill of [start, end): the same for every rerun of the same range."""
    from datetime import UTC, datetime

    from ingest.reader import to_epoch_us
    from lineage import static_run_id

    lo, hi = to_epoch_us(start), to_epoch_us(end)
    if lo is None or hi is None:
        raise ValueError(f"a backfill range needs both bounds (got {start} .. {end})")
    return static_run_id(job, datetime.fromtimestamp(lo / 1e6, UTC), datetime.fromtimestamp(hi / 1e6, UTC))


def _settings(lake: str | None, clip_weights: str | None, provider: str | None, threads: int | None,
              batch_size: int | None) -> tuple[IngestSettings, PreprocessSettings]:
    return (IngestSettings().with_overrides(lake=lake),
            PreprocessSettings().with_overrides(clip_weights=clip_weights, provider=provider, threads=threads,
                                                batch_size=batch_size))


def _run(job: str, stream: str, ingest_settings: IngestSettings, settings: PreprocessSettings,
         operators: list[str] | None, max_rows: int | None, backfill: tuple[str, str, str | None, bool] | None,
         artifact_key: str) -> dict[str, Any]:
    from prefect.runtime import flow_run

    emitter = LineageEmitter(ingest_settings.lake)
    run_id = str(flow_run.id) if backfill is None else _static_id(job, backfill[0], backfill[1])
    inputs, outputs = _lineage(ingest_settings, stream)
    emitter.emit("START", job, run_id, inputs=inputs())
    try:
        summary = features_task(stream, ingest_settings, settings, operators, max_rows, backfill, (job, run_id))
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, inputs=inputs(), error=err)
        raise
    emitter.emit("COMPLETE", job, run_id, inputs=inputs(), outputs=outputs(summary),
                 run_facets=_operators_facet(summary))
    create_markdown_artifact(key=artifact_key, markdown=summary_markdown(summary), description=summary.line())
    return summary.as_dict()


@flow(name="preprocess-stream", log_prints=False)
def preprocess_stream(stream: str, lake: str | None = None, operators: list[str] | None = None,
                      max_rows: int | None = None, clip_weights: str | None = None, provider: str | None = None,
                      threads: int | None = None, batch_size: int | None = None,
                      then_drift: bool = False) -> dict[str, Any]:
    """Compute the features rows ``<lake>/<stream>`` is missing, with the default operator of each
    modality (or the given ``operators``, NAME@VERSION); with ``then_drift``, run the drift flow on the
    stream afterwards (a subflow). Unset parameters come from ``MMLAKE_...``."""
    ingest_settings, settings = _settings(lake, clip_weights, provider, threads, batch_size)
    out = _run(f"preprocess-stream.{stream}", stream, ingest_settings, settings, operators, max_rows, None,
               f"preprocess-{stream}".lower().replace("_", "-"))
    if then_drift:
        from flows.drift import drift_stream

        out["drift"] = drift_stream(stream=stream, lake=ingest_settings.lake)
    return out


@flow(name="backfill-features", flow_run_name="backfill {stream} {start}..{end}", log_prints=False)
def backfill_features(stream: str, start: str, end: str, lake: str | None = None, operator: str | None = None,
                      force: bool = False, clip_weights: str | None = None, provider: str | None = None,
                      threads: int | None = None, batch_size: int | None = None) -> dict[str, Any]:
    """Recompute the features of ``start <= event_time < end`` (with ``operator`` NAME@VERSION: only
    that operator's modality). A range already computed by the same operator bytes is left alone
    unless ``force``."""
    ingest_settings, settings = _settings(lake, clip_weights, provider, threads, batch_size)
    return _run(f"backfill-features.{stream}", stream, ingest_settings, settings, None, None,
                (start, end, operator, force), f"backfill-{stream}".lower().replace("_", "-"))


def summary_markdown(summary: PreprocessSummary) -> str:
    lines = [f"### Features of `{summary.stream}`", "", "| | |", "|---|---|",
             f"| rows written | {summary.rows} |", f"| rows with errors | {summary.errors} |",
             f"| commits | {summary.commits} |", f"| ranges already up to date | {summary.skipped_ranges} |",
             f"| execution provider | {summary.runtime.get('provider')} |",
             f"| ONNX Runtime | {summary.runtime.get('ort_version')} |",
             f"| intra-op threads | {summary.runtime.get('intra_op_threads')} |",
             "", "| operator | SHA-256 | trained | rows |", "|---|---|---|---|"]
    for op in summary.operators:
        ref = f"{op['name']}@{op['version']}"
        trained = "yes" if op["trained"] else "**no (seeded, untrained)**"
        lines.append(f"| {ref} | `{op['sha256'][:16]}` | {trained} | {summary.by_operator.get(ref, 0)} |")
    return "\n".join(lines)
