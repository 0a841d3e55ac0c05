"""The demo's pipeline at a small size: what it prints is what the lake holds."""

from __future__ import annotations

import re

import pytest


@pytest.mark.slow
def test_small_demo_runs_every_stage_and_prints_true_counts(
    prefect_harness, tmp_path, capsys, operator_cache, default_lineage
) -> None:
    from deltalake import DeltaTable

    from mmlake.flows.demo import run_demo

    lake = str(tmp_path / "lake")
    assert run_demo(lake=lake, samples=120) == 0
    out = capsys.readouterr().out
    # 120 samples: an image and a caption each, a tone every 4th -> 270 parts; 3 late, 6 malformed.
    assert re.search(r"raw / late / dlq rows\s+270 / 3 / 6", out), out
    assert re.search(r"second ingest run\s+0 new rows", out)
    # The image encoder is the trained one; the caption and audio encoders are seeded.
    assert re.search(r"features\s+270 rows, 0 errors \(audio, text: UNTRAINED", out), out
    assert re.search(r"backfill rerun\s+0 rows rewritten", out)
    for table, rows in (("raw", 270), ("late", 3), ("dlq", 6), ("features", 270)):
        assert DeltaTable(f"{lake}/demo/{table}").to_pyarrow_dataset().count_rows() == rows
    # Too short for a drift window: no alarm, and the cache keeps its entries.
    assert re.search(r"drift alarms\s+none", out)
    assert "entries still served" in out
    hits = re.search(r"cache\s+(\d+) hits \(similarity ([\d.]+)\.\.([\d.]+)\), (\d+) misses of (\d+) lookups", out)
    assert hits and int(hits.group(1)) >= 8 and int(hits.group(5)) == 16 and float(hits.group(3)) <= 1.0001
    assert re.search(r"random\s+miss", out)
    # With the trained encoder, images of a shape no stored image shows miss.
    assert len(re.findall(r"other shape\s+miss", out)) == 4 and not re.search(r"other shape\s+hit", out)
    assert re.search(r"lineage\s+\d+ OpenLineage events in " + re.escape(lake), out)
