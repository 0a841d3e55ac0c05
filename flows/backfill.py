"""Backfills across stages: one parent flow run per range, a child flow run per day and stage.

``mmlake backfill --stream S --from T1 --to T2 [--stages preprocess,drift]`` (or the ``backfill``
deployment, with these as parameters for ``prefect deployment run`` / ``run_deployment``):

- ``preprocess``: one ``backfill-features`` child run per UTC day of the range (each a predicate
  overwrite of that day; a day already computed by the same operator bytes is left alone unless
  ``force``);
- ``drift``: when the features of the range changed (or only the drift stage was asked for), one
  ``drift-stream`` child run with ``rebuild``: the windows are rescored from the reference on, and a
  rescoring that gives what the table holds writes nothing.

A rerun changes nothing (no new Delta version anywhere). Lineage run ids are deterministic: the same
job and range give the same run id (``lineage.static_run_id``), so a rerun is recognisably the same run.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from ingest import IngestSettings
from ingest.engine import format_us
from ingest.errors import InputError
from lineage import LineageEmitter
from lineage.datasets import delta_input, delta_output

STAGES = ("preprocess", "drift")
_US_PER_DAY = 86_400_000_000


def parse_stages(stages: str | list[str] | None) -> list[str]:
    from flows.deployments import parse_stages as parse

    return parse(stages, STAGES, "backfill")


def days(lo_us: int, hi_us: int) -> list[tuple[int, int]]:
    """[lo, hi) cut at UTC midnights."""
    out = []
    at = lo_us
    while at < hi_us:
        nxt = min((at // _US_PER_DAY + 1) * _US_PER_DAY, hi_us)
        out.append((at, nxt))
        at = nxt
    return out


def check_range(start: str, end: str) -> tuple[int, int]:
    from ingest.reader import to_epoch_us

    lo, hi = to_epoch_us(start), to_epoch_us(end)
    if lo is None or hi is None or hi <= lo:
        raise InputError(f"--from must be before --to (got {start} .. {end})")
    return lo, hi


@flow(name="backfill", flow_run_name="backfill {stream} {start}..{end} ({stages})", log_prints=False)
def backfill(stream: str, start: str, end: str, stages: str = "preprocess,drift", lake: str | None = None,
             operator: str | None = None, force: bool = False, clip_weights: str | None = None,
             provider: str | None = None, threads: int | None = None,
             batch_size: int | None = None) -> dict[str, Any]:
    """Re-run ``start <= event_time < end`` of ``stream`` through ``stages`` (see the module docstring)."""
    from flows.drift import drift_stream
    from flows.preprocess import PROGRESS, _static_id, backfill_features
    from ingest.tables import StreamTables

    logger = get_run_logger()
    lo, hi = check_range(start, end)
    chosen = parse_stages(stages)
    settings = IngestSettings().with_overrides(lake=lake)
    tables = StreamTables(settings.lake, stream, dict(settings.storage_options))
    job = f"backfill.{stream}"
    run_id = _static_id(job, start, end)
    emitter = LineageEmitter(settings.lake)

    inputs = [delta_input(tables.uri(n), dt) for n in ("raw", "features") if (dt := tables.open(n)) is not None]
    emitter.emit("START", job, run_id, inputs=inputs)
    out: dict[str, Any] = {"stream": stream, "start": start, "end": end, "stages": chosen, "days": [],
                           "rows": 0, "skipped_days": 0, "drift": None}
    try:
        if "preprocess" in chosen:
            hooks = list(PROGRESS)
            done_before, grand = 0, _raw_rows(tables, lo, hi)
            for d0, d1 in days(lo, hi):
                seen = [0]

                def relay(done: int, total: int, seen: list[int] = seen, base: int = done_before) -> None:
                    seen[0] = total
                    for hook in hooks:
                        hook(base + done, max(grand, base + total))

                PROGRESS[:] = [relay]
                try:
                    day = backfill_features(stream=stream, start=format_us(d0), end=format_us(d1), lake=settings.lake,
                                            operator=operator, force=force, clip_weights=clip_weights,
                                            provider=provider, threads=threads, batch_size=batch_size)
                finally:
                    PROGRESS[:] = hooks
                done_before += seen[0]
                out["days"].append({"from": format_us(d0), "to": format_us(d1), "rows": day["rows"],
                                    "up_to_date": bool(day["skipped_ranges"] and not day["rows"])})
                out["rows"] += day["rows"]
                out["skipped_days"] += int(bool(day["skipped_ranges"] and not day["rows"]))
        if "drift" in chosen:
            if tables.open("drift") is None:
                out["drift"] = {"status": "no drift table yet: nothing to rescore"}
            elif "preprocess" in chosen and out["rows"] == 0:
                out["drift"] = {"status": "features of the range unchanged: drift left alone"}
            else:
                # Rescored with the settings the drift table was scored with (a backfill changes data,
                # not how drift is measured).
                out["drift"] = drift_stream(stream=stream, lake=settings.lake, rebuild=True, keep_settings=True)
    except BaseException as err:
        emitter.emit("FAIL", job, run_id, inputs=inputs, error=err)
        raise
    outputs = [delta_output(tables.uri(n), dt) for n in ("features", "drift") if (dt := tables.open(n)) is not None]
    emitter.emit("COMPLETE", job, run_id, inputs=inputs, outputs=outputs)
    logger.info("backfill %s %s..%s: %d rows rewritten over %d day(s), %d up to date", stream, start, end,
                out["rows"], len(out["days"]), out["skipped_days"])
    create_markdown_artifact(key=f"backfill-{stream}".lower().replace("_", "-"), markdown=_markdown(out),
                             description=f"backfill {stream} {start}..{end}")
    return out


def _raw_rows(tables: Any, lo: int, hi: int) -> int:
    import pyarrow as pa
    import pyarrow.dataset as pads

    raw = tables.open("raw")
    if raw is None:
        return 0
    ts = pa.timestamp("us", tz="UTC")
    flt = (pads.field("event_time") >= pa.scalar(lo, ts)) & (pads.field("event_time") < pa.scalar(hi, ts))
    return int(raw.to_pyarrow_dataset().count_rows(filter=flt))


def _markdown(out: dict[str, Any]) -> str:
    lines = [f"### Backfill of `{out['stream']}` {out['start']}..{out['end']}", "",
             f"stages: {', '.join(out['stages'])}; {out['rows']} feature rows rewritten", "",
             "| day | rows rewritten | up to date |", "|---|---|---|"]
    lines += [f"| {d['from']}..{d['to']} | {d['rows']} | {'yes' if d['up_to_date'] else 'no'} |" for d in out["days"]]
    drift = out.get("drift")
    if drift:
        lines += ["", f"drift: {drift.get('status')}"]
    return "\n".join(lines)
