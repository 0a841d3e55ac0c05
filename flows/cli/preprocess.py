"""``mmlake preprocess`` (the features a stream is missing) and ``mmlake backfill`` (a range again)."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from mmlake.errors import InputError
from mmlake.flows.cli.options import (
    add_lake,
    add_reference_range,
    add_runtime,
    cancel_on_signals,
    ingest_settings,
    positive_int,
    preprocess_settings,
    reference_range,
    stream_name,
)

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands
    from mmlake.preprocessing.settings import PreprocessSettings
    from mmlake.settings import LakeSettings


def register(commands: Commands) -> None:
    p = commands.add_parser("preprocess", help="compute the features rows a stream is missing (ONNX operators)")
    p.add_argument("--stream", required=True, type=stream_name)
    add_lake(p)
    p.add_argument(
        "--operator",
        action="append",
        metavar="NAME@VERSION",
        help="use this operator for its modality (repeatable; default: the registry's defaults)",
    )
    p.add_argument("--max-rows", type=positive_int, help="stop after this many rows")
    p.add_argument("--then-drift", action="store_true", help="run the drift flow on the stream afterwards")
    add_runtime(p)
    p.set_defaults(func=preprocess)

    p = commands.add_parser("backfill", help="re-run an event-time range through the stages (features, then drift)")
    p.add_argument("--stream", required=True, type=stream_name)
    p.add_argument("--from", dest="start", required=True, help="first event time (RFC 3339 or epoch ms), inclusive")
    p.add_argument("--to", dest="end", required=True, help="last event time, exclusive")
    p.add_argument("--operator", metavar="NAME@VERSION", help="only this operator's modality, with this operator")
    p.add_argument("--force", action="store_true", help="rewrite even a range that is already up to date")
    p.add_argument(
        "--stages",
        default="preprocess,drift",
        help="what to re-run for the range, in order: preprocess, drift (default both; drift is "
        "rescored only when the range's features changed)",
    )
    p.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    add_reference_range(p)
    add_lake(p)
    add_runtime(p)
    p.set_defaults(func=backfill)


def _precheck(args: argparse.Namespace, operators: list[str]) -> tuple[LakeSettings, PreprocessSettings]:
    """Fail fast, before Prefect spends seconds starting: the stream's raw table and the operators.
    Returns the settings the run goes on with."""
    from mmlake.preprocessing.registry import load_registry

    lake = ingest_settings(args, writes=True)
    tables = lake.tables(args.stream)
    if not tables.exists("raw"):
        raise InputError(f"stream {args.stream!r} has no raw table at {tables.uri('raw')} (ingest it first)")
    settings = preprocess_settings(args)
    registry = load_registry(settings)
    for ref in operators:
        registry.operator(ref)
    return lake, settings


def preprocess(args: argparse.Namespace) -> int:
    from mmlake.flows.preprocess import preprocess_stream

    lake, settings = _precheck(args, args.operator or [])
    result = preprocess_stream(
        stream=args.stream,
        lake=lake,
        settings=settings,
        operators=args.operator or None,
        max_rows=args.max_rows,
        then_drift=args.then_drift,
        cancel=cancel_on_signals(),
    )
    for line in result.lines():
        print(line)
    return 0


def backfill(args: argparse.Namespace) -> int:
    from mmlake.flows.backfill import backfill
    from mmlake.flows.stages import BackfillPlan

    plan = BackfillPlan(start=args.start, end=args.end, stages=args.stages, operator=args.operator, force=args.force)
    plan.bounds_us()
    reference = reference_range(args)
    stages = plan.stage_list()
    if "preprocess" in stages:
        lake, settings = _precheck(args, [args.operator] if args.operator else [])
    else:
        lake, settings = ingest_settings(args, writes=True), preprocess_settings(args)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(
        TextColumn(f"backfill {args.stream} {args.start}..{args.end}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=False,
        disable=not sys.stderr.isatty() and not args.progress,
        console=None,
    ) as bar:
        job = bar.add_task("rows", total=None)
        result = backfill(
            stream=args.stream,
            plan=plan,
            lake=lake,
            settings=settings,
            reference=reference,
            progress=lambda done, total: bar.update(job, completed=done, total=total),
        )
    for line in result.lines():
        print(line)
    return 0
