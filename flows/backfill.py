"""Backfills across stages: one parent flow run per range, a child flow run per day and stage.

``mmlake backfill --stream S --from T1 --to T2 [--stages preprocess,drift]`` (or the ``backfill``
deployment, with a ``plan`` parameter for ``prefect deployment run`` / ``run_deployment``):

- ``preprocess``: one ``backfill-features`` child run per UTC day of the range (each a predicate
  overwrite of that day; a day already computed by the same operator bytes is left alone unless the
  plan says ``force``);
- ``drift``: when the features of the range changed (or only the drift stage was asked for), one
  ``drift-stream`` child run with ``rebuild``: the windows are rescored from the reference on (the one
  the codebooks were fitted on, or the ``reference`` range given here), and a rescoring that gives what
  the table holds writes nothing (the rule: :func:`mmlake.preprocessing.backfill.drift_left_alone`).

A rerun changes nothing (no new Delta version anywhere). Lineage run ids are deterministic: the same
job and range give the same run id (``mmlake.lineage.static_run_id``), so a rerun is recognisably the
same run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from mmlake.flows.drift import drift_stream
from mmlake.flows.preprocess import backfill_features, backfill_run_id
from mmlake.flows.stages import BackfillPlan, artifact_key, backfill_run_name
from mmlake.lake import days, format_us
from mmlake.lineage import LineageEmitter
from mmlake.lineage.datasets import table_inputs, table_outputs
from mmlake.preprocessing.backfill import drift_left_alone, raw_rows_in
from mmlake.preprocessing.drift.report import DriftResult
from mmlake.preprocessing.drift.settings import ReferenceRange
from mmlake.preprocessing.settings import PreprocessSettings
from mmlake.settings import LakeSettings


@dataclass(frozen=True)
class BackfillDay:
    """One UTC day of a backfill's range: its bounds, the feature rows rewritten, whether it was up to date."""

    start: str
    end: str
    rows: int
    up_to_date: bool


@dataclass
class BackfillResult:
    """What a backfill did: each day's features, and the drift stage (rescored, or why not)."""

    stream: str
    plan: BackfillPlan
    stages: list[str]
    days: list[BackfillDay] = field(default_factory=list)
    drift: DriftResult | None = None
    drift_skipped: str | None = None  # why drift was left alone, when it was

    @property
    def rows(self) -> int:
        return sum(day.rows for day in self.days)

    @property
    def skipped_days(self) -> int:
        return sum(day.up_to_date for day in self.days)

    @property
    def drift_status(self) -> str | None:
        """What the drift stage did: the rescoring's status, or why it left drift alone (None: not asked)."""
        return self.drift.summary.status if self.drift is not None else self.drift_skipped

    def lines(self) -> list[str]:
        """The summary lines the CLI prints."""
        out = []
        plan = self.plan
        if "preprocess" in self.stages:
            if self.days and self.skipped_days == len(self.days):
                out.append(
                    f"{self.stream}: {plan.start}..{plan.end} is already up to date ({self.skipped_days} days "
                    "checked, nothing rewritten)"
                )
            else:
                out.append(
                    f"{self.stream}: {self.rows} feature rows rewritten over {len(self.days)} day(s) "
                    f"({self.skipped_days} already up to date)"
                )
        if self.drift is not None:
            out.append(self.drift.line())
        elif self.drift_skipped is not None:
            out.append(f"{self.stream}: drift: {self.drift_skipped}")
        return out

    def markdown(self) -> str:
        lines = [
            f"### Backfill of `{self.stream}` {self.plan.start}..{self.plan.end}",
            "",
            f"stages: {', '.join(self.stages)}; {self.rows} feature rows rewritten",
            "",
            "| day | rows rewritten | up to date |",
            "|---|---|---|",
        ]
        lines += [f"| {d.start}..{d.end} | {d.rows} | {'yes' if d.up_to_date else 'no'} |" for d in self.days]
        if self.drift_status:
            lines += ["", f"drift: {self.drift_status}"]
        return "\n".join(lines)


@flow(name="backfill", flow_run_name=partial(backfill_run_name, with_stages=True), log_prints=False)
def backfill(
    stream: str,
    plan: BackfillPlan,
    lake: LakeSettings | None = None,
    settings: PreprocessSettings | None = None,
    reference: ReferenceRange | None = None,
    progress: Any = None,
) -> BackfillResult:
    """Re-run the plan's range of ``stream`` through its stages (see the module docstring). In-process
    runs may pass ``progress``, called with (raw rows done, raw rows in the range). ``reference`` moves
    the drift reference as the rescoring starts over (the drift stage then runs even when no feature
    changed)."""
    logger = get_run_logger()
    lo, hi = plan.bounds_us()
    reference = reference or ReferenceRange()
    reference.bounds_us()  # a bad range fails before any day is rewritten
    lake = lake or LakeSettings()
    tables = lake.tables(stream)
    job = f"backfill.{stream}"
    result = BackfillResult(stream, plan, plan.stage_list())
    inputs = table_inputs(tables, ("raw", "features"), existing_only=True)
    with LineageEmitter.for_lake(lake).run(job, backfill_run_id(job, plan), inputs=inputs) as run:
        if "preprocess" in result.stages:
            done_before, grand = 0, raw_rows_in(tables, lo, hi)
            for d0, d1 in days(lo, hi):
                seen = [0]

                def relay(done: int, total: int, seen: list[int] = seen, base: int = done_before) -> None:
                    seen[0] = total
                    if progress is not None:
                        progress(base + done, max(grand, base + total))

                day = backfill_features(
                    stream=stream,
                    plan=plan.day(format_us(d0), format_us(d1)),
                    lake=lake,
                    settings=settings,
                    progress=relay,
                )
                done_before += seen[0]
                result.days.append(
                    BackfillDay(format_us(d0), format_us(d1), day.rows, bool(day.skipped_ranges and not day.rows))
                )
        if "drift" in result.stages:
            rewritten = result.rows if "preprocess" in result.stages else None
            result.drift_skipped = drift_left_alone(tables.exists("drift"), rewritten, reference.moves)
            if result.drift_skipped is None:
                # Rescored with the settings the drift table was scored with (a backfill changes data,
                # not how drift is measured), from the reference it was fitted on unless given another.
                result.drift = drift_stream(
                    stream=stream, lake=lake, rebuild=True, keep_settings=True, reference=reference
                )
        run.complete(outputs=table_outputs(tables, ("features", "drift"), existing_only=True))
    logger.info(
        "backfill %s %s..%s: %d rows rewritten over %d day(s), %d up to date",
        stream,
        plan.start,
        plan.end,
        result.rows,
        len(result.days),
        result.skipped_days,
    )
    create_markdown_artifact(
        key=artifact_key("backfill", stream),
        markdown=result.markdown(),
        description=f"backfill {stream} {plan.start}..{plan.end}",
    )
    return result
