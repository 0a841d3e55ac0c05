"""``mmlake ops list|verify|build``: the ONNX operator registry."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from mmlake.errors import MmlakeError
from mmlake.flows.cli.options import add_clip_weights

if TYPE_CHECKING:
    from mmlake.flows.cli.options import Commands
    from mmlake.preprocessing.registry import Registry


def register(commands: Commands) -> None:
    p = commands.add_parser("ops", help="the ONNX operator registry")
    ops = p.add_subparsers(dest="ops_command", required=True, metavar="COMMAND")
    p = ops.add_parser("list", help="operators, their models and hashes")
    add_clip_weights(p)
    p.set_defaults(func=list_operators)
    p = ops.add_parser("verify", help="check every model against its recorded hash and a regeneration")
    add_clip_weights(p)
    p.add_argument("--no-regenerate", action="store_true", help="only check the files' hashes")
    p.set_defaults(func=verify)
    p = ops.add_parser("build", help="generate the encoder models into the cache now")
    add_clip_weights(p)
    p.set_defaults(func=build)


def _registry(args: argparse.Namespace) -> Registry:
    """The operator registry (with ``--clip-weights`` where given)."""
    from mmlake.preprocessing.registry import load_registry
    from mmlake.preprocessing.settings import PreprocessSettings

    return load_registry(PreprocessSettings().with_overrides(clip_weights=args.clip_weights))


def list_operators(args: argparse.Namespace) -> int:
    registry = _registry(args)
    defaults = set(registry.defaults.values())
    print("operators (what features rows name):")
    for ref, op in sorted(registry.operators.items()):
        mark = "*" if ref in defaults else " "
        trained = "trained" if op.trained else "UNTRAINED (seeded)"
        print(f" {mark} {ref:28} {op.modality:6} sha256 {op.sha256[:16]}  {trained}")
        for m in op.models:
            where = registry.model_path(m)
            state = "generated on first use" if m.generated and not where.exists() else str(where)
            print(f"     {m.ref:32} opset {m.opset}  sha256 {str(registry.expected_sha256(m))[:16]}  {state}")
    print("(* default for its modality)")
    return 0


def verify(args: argparse.Namespace) -> int:
    from mmlake.preprocessing.verify import verify

    registry = _registry(args)
    results = verify(registry, regenerate=not args.no_regenerate)
    for result in results:
        print(result.text())
    bad = [r.ref for r in results if not r.ok]
    if bad:
        raise MmlakeError(f"{len(bad)} of {len(results)} operator models failed verification: {', '.join(bad)}")
    return 0


def build(args: argparse.Namespace) -> int:
    """Generate the encoder models into the cache now (replacing any cached copy)."""
    from mmlake.preprocessing.build import build_generated

    for ref, path in build_generated(_registry(args)):
        print(f"{ref}: {path}")
    return 0
