"""The ``mmlake`` command line. Every failure a user can cause ends in one line on stderr and a
non-zero exit code (2 for bad arguments, 1 for everything else).

One module per command group declares its commands' options beside their handlers (``register``);
this module assembles them and is the one error handler they share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from mmlake.errors import MmlakeError
from mmlake.flows.cli import broker, cache, drift, ingest, lineage, ops, preprocess, serve

__all__ = ["build_parser", "main"]

#: The command groups, in the order ``mmlake --help`` lists them.
GROUPS = (broker, ingest, serve, cache, lineage, preprocess, drift, ops)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmlake", description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.register(commands)
    return parser


def one_line(err: BaseException) -> str:
    """An error as one line: a settings source that cannot be parsed, a store that cannot be reached,
    a path that cannot be written, ..."""
    from pydantic_settings import SettingsError

    if isinstance(err, SettingsError):
        return f"bad setting: {str(err).splitlines()[0]} (check the MMLAKE_... environment variables)"
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).replace("↳", ";")  # delta-rs colours its error chains
    text = " ".join(plain.split()) or type(err).__name__
    if len(text) > 300:
        text = text[:300] + "..."
    return text if isinstance(err, OSError) else f"{type(err).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmlake`` console script."""
    from pydantic import ValidationError

    # No telemetry from the ephemeral Prefect server unless the user asks for it.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MmlakeError as err:
        print(f"mmlake: error: {err}", file=sys.stderr)
        return 1
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        print(f"mmlake: error: bad setting {where}: {first.get('msg')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        if os.environ.get("MMLAKE_DEBUG"):
            raise
        print(f"mmlake: error: {one_line(err)} (MMLAKE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1
