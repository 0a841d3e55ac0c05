"""Regenerate every operator model byte for byte: ``python -m preprocessing.build [--write]``.

Without ``--write`` it rebuilds each model and compares with the recorded SHA-256 (what
``mmlake ops verify`` does). With ``--write`` it writes the committed graphs under
``preprocessing/models/`` and records every hash in ``preprocessing/operators.json`` — run it after
changing a builder, then give the changed operators a new version.
"""

from __future__ import annotations

import argparse
import json
import sys

from preprocessing.registry import DEFAULT_MANIFEST, Registry, _atomic_write, sha256_hex


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
    from preprocessing.verify import verify

    results = verify(registry, regenerate=True)
    for line in results:
        print(line.text())
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
