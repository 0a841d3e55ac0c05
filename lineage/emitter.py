"""One OpenLineage emitter for every flow and task: START, then COMPLETE or FAIL.

Flows and tasks wrap their work in :meth:`LineageEmitter.run`, which emits START on entry, FAIL with
the error if the block raises, and COMPLETE (with what the block reported) if it does not.

The client is configured the standard way (``openlineage.yml``, ``OPENLINEAGE__TRANSPORT__...``,
``OPENLINEAGE_URL``, ``OPENLINEAGE_DISABLED``). With none of those, events stay in the lake: a file
transport at ``<lake>/_lineage/events.jsonl`` on a local lake, an append-only Delta table
``<lake>/_lineage/events`` (:mod:`mmlake.lineage.transport`) on an object store, where a file cannot be
appended to. Emission is bounded in time (``MMLAKE_LINEAGE_TIMEOUT_S``) and never
raises into the flow: a failed or slow emission is logged and the flow goes on.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mmlake.lake import is_local, lake_root
from mmlake.lineage.settings import LineageSettings
from mmlake.settings import LakeSettings

log = logging.getLogger(__name__)

PRODUCER = "https://github.com/mmlake/mmlake"


def _standard_config_present() -> bool:
    if os.environ.get("OPENLINEAGE_URL") or os.environ.get("OPENLINEAGE_CONFIG"):
        return True
    if any(k.startswith("OPENLINEAGE__") for k in os.environ):
        return True
    return any(p.exists() for p in (Path.cwd() / "openlineage.yml", Path.home() / ".openlineage" / "openlineage.yml"))


def default_events_path(lake: str) -> str:
    """Where the default transport keeps a local lake's events (a JSON-lines file)."""
    return f"{lake_root(lake).removeprefix('file://')}/_lineage/events.jsonl"


def default_events_table(lake: str) -> str:
    """Where the default transport keeps an object-store lake's events (a Delta table)."""
    return f"{lake_root(lake)}/_lineage/events"


def _client(lake: str, storage_options: dict[str, str] | None) -> Any:
    from openlineage.client import OpenLineageClient
    from openlineage.client.transport.file import FileConfig, FileTransport

    if os.environ.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true" or _standard_config_present():
        return OpenLineageClient()
    if not is_local(lake):
        from mmlake.lineage.transport import DeltaLogConfig, DeltaLogTransport

        return OpenLineageClient(
            transport=DeltaLogTransport(DeltaLogConfig(default_events_table(lake), dict(storage_options or {})))
        )
    path = default_events_path(lake)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return OpenLineageClient(transport=FileTransport(FileConfig(log_file_path=path, append=True)))


#: Datasets as a list, or a function that lists them when each event is built (so FAIL and COMPLETE
#: see the tables' versions at that moment).
Datasets = list[Any] | Callable[[], list[Any]]


def _resolve(datasets: Datasets | None) -> list[Any]:
    if datasets is None:
        return []
    return datasets() if callable(datasets) else list(datasets)


class LineageRun:
    """What a run reports for its COMPLETE event; see :meth:`LineageEmitter.run`."""

    def __init__(self, inputs: Datasets | None) -> None:
        self.inputs = inputs
        self.outputs: Datasets | None = None
        self.run_facets: dict[str, Any] | None = None

    def complete(
        self,
        *,
        inputs: Datasets | None = None,
        outputs: Datasets | None = None,
        run_facets: dict[str, Any] | None = None,
    ) -> None:
        """Set what COMPLETE carries (inputs default to START's)."""
        if inputs is not None:
            self.inputs = inputs
        self.outputs = outputs
        self.run_facets = run_facets


def now_iso() -> str:
    return datetime.now(UTC).isoformat()


class LineageEmitter:
    """Emits the run events of mmlake's jobs. Never raises; each emit waits at most ``timeout_s``."""

    def __init__(
        self, lake: str, settings: LineageSettings | None = None, *, storage_options: dict[str, str] | None = None
    ) -> None:
        self.settings = settings or LineageSettings()
        self.namespace = self.settings.namespace
        try:
            self._client: Any = _client(lake, storage_options)
        except Exception as err:  # a broken configuration must not stop the pipeline
            log.warning("OpenLineage disabled for this run: cannot configure the client: %s", err)
            self._client = None

    @classmethod
    def for_lake(cls, lake: LakeSettings) -> LineageEmitter:
        """The emitter of runs over ``lake`` (its events go where its storage allows, see above)."""
        return cls(lake.lake, storage_options=dict(lake.storage_options))

    @contextlib.contextmanager
    def run(
        self,
        job_name: str,
        run_id: str,
        *,
        job_type: str = "JOB",
        processing: str = "BATCH",
        parent: tuple[str, str] | None = None,
        inputs: Datasets | None = None,
    ) -> Iterator[LineageRun]:
        """Emit START now; then FAIL with the error if the block raises (the error propagates), or
        COMPLETE with what the block set through :meth:`LineageRun.complete`.

        >>> with emitter.run("ingest-stream.s", run_id, inputs=[topic]) as run:  # doctest: +SKIP
        ...     summary = run_ingest(...)
        ...     run.complete(outputs=[raw])
        """
        common: dict[str, Any] = {"job_type": job_type, "processing": processing, "parent": parent}
        self.emit("START", job_name, run_id, inputs=_resolve(inputs), **common)
        handle = LineageRun(inputs)
        try:
            yield handle
        except BaseException as err:
            self.emit("FAIL", job_name, run_id, inputs=_resolve(inputs), error=err, **common)
            raise
        self.emit(
            "COMPLETE",
            job_name,
            run_id,
            inputs=_resolve(handle.inputs),
            outputs=_resolve(handle.outputs),
            run_facets=handle.run_facets,
            **common,
        )

    def emit(
        self,
        event_type: str,
        job_name: str,
        run_id: str,
        *,
        job_type: str = "JOB",
        processing: str = "BATCH",
        parent: tuple[str, str] | None = None,
        root: tuple[str, str] | None = None,
        inputs: list[Any] | None = None,
        outputs: list[Any] | None = None,
        run_facets: dict[str, Any] | None = None,
        error: BaseException | None = None,
        nominal: tuple[str, str | None] | None = None,
    ) -> None:
        """Emit one RunEvent; ``parent``/``root`` are (job name, run id) in this namespace."""
        if self._client is None:
            return
        try:
            event = self._event(
                event_type,
                job_name,
                run_id,
                job_type,
                processing,
                parent,
                root,
                inputs,
                outputs,
                run_facets,
                error,
                nominal,
            )
        except Exception as err:
            log.warning("OpenLineage event for %s not built: %s", job_name, err)
            return
        done = threading.Event()
        failure: list[BaseException] = []

        def send() -> None:
            try:
                self._client.emit(event)
            except BaseException as err:
                failure.append(err)
            finally:
                done.set()

        threading.Thread(target=send, name="mmlake-lineage", daemon=True).start()
        if not done.wait(self.settings.timeout_s):
            log.warning(
                "OpenLineage %s event for %s still not sent after %.1fs; going on",
                event_type,
                job_name,
                self.settings.timeout_s,
            )
        elif failure:
            log.warning("OpenLineage %s event for %s failed: %s", event_type, job_name, failure[0])

    def _event(
        self,
        event_type: str,
        job_name: str,
        run_id: str,
        job_type: str,
        processing: str,
        parent: tuple[str, str] | None,
        root: tuple[str, str] | None,
        inputs: list[Any] | None,
        outputs: list[Any] | None,
        run_facets: dict[str, Any] | None,
        error: BaseException | None,
        nominal: tuple[str, str | None] | None,
    ) -> Any:
        from openlineage.client.event_v2 import Job, Run, RunEvent, RunState
        from openlineage.client.facet_v2 import (
            error_message_run,
            job_type_job,
            nominal_time_run,
            parent_run,
            processing_engine_run,
        )

        from mmlake import __version__

        facets: dict[str, Any] = dict(run_facets or {})
        facets["processing_engine"] = processing_engine_run.ProcessingEngineRunFacet(
            version=__version__, name="mmlake", openlineageAdapterVersion=_client_version()
        )
        if parent is not None:
            root_job, root_run = root or parent
            facets["parent"] = parent_run.ParentRunFacet(
                run=parent_run.Run(runId=parent[1]),
                job=parent_run.Job(namespace=self.namespace, name=parent[0]),
                root=parent_run.Root(
                    run=parent_run.RootRun(runId=root_run),
                    job=parent_run.RootJob(namespace=self.namespace, name=root_job),
                ),
            )
        if nominal is not None:
            facets["nominalTime"] = nominal_time_run.NominalTimeRunFacet(
                nominalStartTime=nominal[0], nominalEndTime=nominal[1]
            )
        if error is not None:
            facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
                message=str(error) or type(error).__name__, programmingLanguage="python"
            )
        job_facets: dict[str, Any] = {
            "jobType": job_type_job.JobTypeJobFacet(processingType=processing, integration="MMLAKE", jobType=job_type)
        }
        return RunEvent(
            eventType=getattr(RunState, event_type),
            eventTime=now_iso(),
            producer=PRODUCER,
            run=Run(runId=run_id, facets=facets),
            job=Job(namespace=self.namespace, name=job_name, facets=job_facets),
            inputs=inputs or [],
            outputs=outputs or [],
        )


def _client_version() -> str:
    from importlib.metadata import version

    try:
        return version("openlineage-python")
    except Exception:
        return "unknown"


def static_run_id(job_name: str, start: datetime, end: datetime) -> str:
    """The same run id for the same job and range (backfill reruns are identifiable)."""
    from openlineage.client.uuid import generate_static_uuid

    return str(generate_static_uuid(start, f"{job_name}|{start.isoformat()}|{end.isoformat()}".encode()))
