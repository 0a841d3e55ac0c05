"""``mmlake cache serve``: SafeCache's HTTP API."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from mmlake.errors import InputError
from mmlake.flows.cli.options import port

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands


def register(commands: Commands) -> None:
    p = commands.add_parser("cache", help="SafeCache, the KV cache for inference servers")
    cache = p.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    p = cache.add_parser("serve", help="serve the SafeCache v1 HTTP API")
    p.add_argument("--port", type=port, default=8470)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--tokens", required=True, help="JSON file mapping each bearer token to its tenant")
    p.add_argument("--snapshot-dir", help="restore live entries from here on start, save them here on stop")
    p.set_defaults(func=serve)


def serve(args: argparse.Namespace) -> int:
    from mmlake.cache.server import serve

    if args.snapshot_dir and Path(args.snapshot_dir).exists() and not Path(args.snapshot_dir).is_dir():
        raise InputError(f"--snapshot-dir {args.snapshot_dir} is a file, not a folder")
    serve(args.port, args.tokens, host=args.host, snapshot_dir=args.snapshot_dir)
    return 0
