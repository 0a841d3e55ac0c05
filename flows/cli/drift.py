"""``mmlake drift``: score the drift windows a stream's new features complete."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mmlake.errors import InputError
from mmlake.flows.cli.options import (
    add_lake,
    add_reference_range,
    ingest_settings,
    positive_int,
    reference_range,
    stream_name,
)

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("drift", help="score drift windows over a stream's new features")
    p.add_argument("--stream", required=True, type=stream_name)
    add_lake(p)
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="start over: fit a new reference and rescore every window (after a backfill or a change "
        "of operator or settings)",
    )
    p.add_argument("--max-samples", type=positive_int, help="take at most this many new samples in this run")
    p.add_argument("--window", type=positive_int, help="samples per window (default 128; $MMLAKE_DRIFT_WINDOW)")
    p.add_argument("--step", type=positive_int, help="samples between windows (default 16)")
    p.add_argument("--reference", type=positive_int, help="samples in the reference window (default 1024)")
    add_reference_range(p)
    p.set_defaults(func=drift)


def drift(args: argparse.Namespace) -> int:
    from mmlake.flows.drift import drift_stream
    from mmlake.preprocessing.drift.settings import DriftSettings

    reference = reference_range(args)  # one line before a flow run starts
    lake = ingest_settings(args, writes=True)
    settings = DriftSettings().with_overrides(window=args.window, step=args.step, reference=args.reference)
    tables = lake.tables(args.stream)
    if not tables.exists("features"):  # before a flow run starts (and its API server with it)
        raise InputError(
            f"stream {args.stream!r} has no features table at {tables.uri('features')} (run `mmlake preprocess` first)"
        )
    result = drift_stream(
        stream=args.stream,
        lake=lake,
        settings=settings,
        rebuild=args.rebuild,
        max_samples=args.max_samples,
        reference=reference,
    )
    print(result.line())
    return 0
