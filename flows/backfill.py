"""Backfills across stages: one parent flow run per range, a child flow run per day and stage.

``mmlake backfill --stream S --from T1 --to T2 [--stages preprocess,drift]`` (or the ``backfill``
deployment, with these as parameters for ``prefect deployment run`` / ``run_deployment``):

- ``preprocess``: one ``backfill-features`` child run per UTC day of the range (each a predicate
  overwrite of that day; a day already computed by the same operator bytes is left alone unless
  ``force``);
- ``drift``: when the features of the range changed (or only the drift stage was asked for), one
  ``drift-stream`` child run with ``rebuild``: the windows are rescored from the reference on (the one
  the codebooks were fitted on, or the range ``reference_from``..``reference_to`` given here), and a
  rescoring that gives what the table holds writes nothing.

A rerun changes nothing (no new Delta version anywhere). Lineage run ids are deterministic: the same
job and range give the same run id (``mmlake.lineage.static_run_id``), so a rerun is recognisably the
same run.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from mmlake.flows.drift import drift_stream, reference_choice
from mmlake.flows.preprocess import backfill_features, backfill_run_id
from mmlake.flows.stages import parse_backfill_stages
from mmlake.lake import days, format_us, time_range
from mmlake.lineage import LineageEmitter
from mmlake.lineage.datasets import table_inputs, table_outputs
from mmlake.preprocessing.backfill import raw_rows_in
from mmlake.settings import LakeSettings


def check_range(start: str, end: str) -> tuple[int, int]:
    """The range as epoch µs; a one-line :class:`~mmlake.errors.InputError` unless start < end."""
    return time_range(start, end)


@flow(name="backfill", flow_run_name="backfill {stream} {start}..{end} ({stages})", log_prints=False)
def backfill(stream: str, start: str, end: str, stages: str = "preprocess,drift", lake: str | None = None,
             operator: str | None = None, force: bool = False, clip_weights: str | None = None,
             provider: str | None = None, threads: int | None = None,
             batch_size: int | None = None, progress: Any = None, reference_from: str | None = None,
             reference_to: str | None = None, reference_first: bool = False) -> dict[str, Any]:
    """Re-run ``start <= event_time < end`` of ``stream`` through ``stages`` (see the module docstring).
    In-process runs may pass ``progress``, called with (raw rows done, raw rows in the range).
    ``reference_from``/``reference_to`` (or ``reference_first``) move the drift reference as the
    rescoring starts over (the drift stage then runs even when no feature changed)."""
    logger = get_run_logger()
    lo, hi = check_range(start, end)
    new_reference = reference_choice(reference_from, reference_to) is not None or reference_first
    chosen = parse_backfill_stages(stages)
    settings = LakeSettings().with_overrides(lake=lake)
    tables = settings.tables(stream)
    job = f"backfill.{stream}"
    out: dict[str, Any] = {"stream": stream, "start": start, "end": end, "stages": chosen, "days": [],
                           "rows": 0, "skipped_days": 0, "drift": None}
    inputs = table_inputs(tables, ("raw", "features"), existing_only=True)
    with LineageEmitter.for_lake(settings).run(job, backfill_run_id(job, start, end), inputs=inputs) as run:
        if "preprocess" in chosen:
            done_before, grand = 0, raw_rows_in(tables, lo, hi)
            for d0, d1 in days(lo, hi):
                seen = [0]

                def relay(done: int, total: int, seen: list[int] = seen, base: int = done_before) -> None:
                    seen[0] = total
                    if progress is not None:
                        progress(base + done, max(grand, base + total))

                day = backfill_features(stream=stream, start=format_us(d0), end=format_us(d1), lake=settings.lake,
                                        operator=operator, force=force, clip_weights=clip_weights,
                                        provider=provider, threads=threads, batch_size=batch_size, progress=relay)
                done_before += seen[0]
                up_to_date = bool(day["skipped_ranges"] and not day["rows"])
                out["days"].append({"from": format_us(d0), "to": format_us(d1), "rows": day["rows"],
                                    "up_to_date": up_to_date})
                out["rows"] += day["rows"]
                out["skipped_days"] += int(up_to_date)
        if "drift" in chosen:
            if not tables.exists("drift"):
                out["drift"] = {"status": "no drift table yet: nothing to rescore"}
            elif "preprocess" in chosen and out["rows"] == 0 and not new_reference:
                out["drift"] = {"status": "features of the range unchanged: drift left alone"}
            else:
                # Rescored with the settings the drift table was scored with (a backfill changes data,
                # not how drift is measured), from the reference it was fitted on unless given another.
                out["drift"] = drift_stream(stream=stream, lake=settings.lake, rebuild=True, keep_settings=True,
                                            reference_from=reference_from, reference_to=reference_to,
                                            reference_first=reference_first)
        run.complete(outputs=table_outputs(tables, ("features", "drift"), existing_only=True))
    logger.info("backfill %s %s..%s: %d rows rewritten over %d day(s), %d up to date", stream, start, end,
                out["rows"], len(out["days"]), out["skipped_days"])
    create_markdown_artifact(key=f"backfill-{stream}".lower().replace("_", "-"), markdown=_markdown(out),
                             description=f"backfill {stream} {start}..{end}")
    return out


def _markdown(out: dict[str, Any]) -> str:
    lines = [f"### Backfill of `{out['stream']}` {out['start']}..{out['end']}", "",
             f"stages: {', '.join(out['stages'])}; {out['rows']} feature rows rewritten", "",
             "| day | rows rewritten | up to date |", "|---|---|---|"]
    lines += [f"| {d['from']}..{d['to']} | {d['rows']} | {'yes' if d['up_to_date'] else 'no'} |" for d in out["days"]]
    drift = out.get("drift")
    if drift:
        lines += ["", f"drift: {drift.get('status')}"]
    return "\n".join(lines)
