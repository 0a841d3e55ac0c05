"""``make bench``: run every benchmark and write ``bench/results/<name>.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def main() -> int:
    from bench import cache_bench, drift_eval, inference_bench, ingest_bench, preprocess_bench

    RESULTS.mkdir(exist_ok=True)
    benches = {
        "ingest": ingest_bench.run,
        "cache": cache_bench.run,
        "preprocess": preprocess_bench.run,
        "drift": drift_eval.run,
        "inference": inference_bench.run,
    }
    only = set(sys.argv[1:])
    for name, bench in benches.items():
        if only and name not in only:
            continue
        print(f"bench {name} ...", flush=True)
        report = bench()
        path = RESULTS / f"{name}.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(json.dumps(report, indent=2))
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
