"""Regenerate operator models byte for byte.

- :func:`build_generated` (``mmlake ops build``): the generated models (the CLIP towers) into the
  cache folder now, rather than on first use.
- ``python -m mmlake.preprocessing.build [--write]``: without ``--write``, rebuild every model and
  compare with the recorded SHA-256 (what ``mmlake ops verify`` does); with ``--write``, write the
  committed graphs under ``preprocessing/models/`` and record every hash in
  ``preprocessing/operators.json`` — run it after changing a builder, then give the changed operators
  a new version.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mmlake.preprocessing.registry import DEFAULT_MANIFEST, Registry, _atomic_write, sha256_hex


def build_generated(registry: Registry) -> list[tuple[str, Path]]:
    """Generate every generated model into the cache folder (replacing cached copies), each checked
    against its recorded SHA-256 (see :meth:`Registry.regenerate`). Returns (model, path) pairs."""
    out = []
    for spec in registry.models.values():
        if spec.generated:
            registry.regenerate(spec)
            out.append((spec.ref, registry.model_path(spec)))
    return out


def write_all(registry: Registry) -> dict[str, str]:
    doc = json.loads(DEFAULT_MANIFEST.read_text())
    hashes = {}
    for ref, spec in registry.models.items():
        data = registry.build(spec)
        hashes[ref] = sha256_hex(data)
        doc["models"][ref]["sha256"] = hashes[ref]
        if spec.file:
            _atomic_write(registry.root / spec.file, data)
        print(f"{ref:34} {hashes[ref]}  ({len(data):,} bytes)")
    _atomic_write(DEFAULT_MANIFEST, (json.dumps(doc, indent=2) + "\n").encode())
    return hashes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="write the models and record their hashes")
    args = parser.parse_args(argv)
    registry = Registry.load()
    if args.write:
        write_all(registry)
        return 0
    from mmlake.preprocessing.verify import verify

    results = verify(registry, regenerate=True)
    for line in results:
        print(line.text())
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
