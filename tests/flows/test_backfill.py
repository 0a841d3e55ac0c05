"""Backfills across stages: a parent run per range, a child run per day, drift rescored only when the
features changed, and a rerun that changes nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mmlake.lake import StreamTables

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
DAY_MS = 86_400_000


@pytest.fixture
def small_drift(monkeypatch, default_lineage):
    for key, value in {"REFERENCE": "32", "CODES": "4", "WINDOW": "8", "STEP": "4"}.items():
        monkeypatch.setenv(f"MMLAKE_DRIFT_{key}", value)


@pytest.mark.slow
def test_backfill_across_stages_is_per_day_and_idempotent(prefect_harness, small_drift, tmp_path) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from mmlake.flows.backfill import backfill
    from mmlake.flows.stages import BackfillPlan
    from mmlake.preprocessing.drift.run import run_drift
    from mmlake.preprocessing.drift.settings import DriftSettings, ReferenceRange
    from mmlake.preprocessing.incremental import run_preprocess
    from mmlake.preprocessing.settings import PreprocessSettings
    from mmlake.settings import LakeSettings
    from tests.preprocessing.helpers import synth_parts, write_raw

    lake = str(tmp_path / "lake")
    write_raw(lake, "s", synth_parts(80, start_ms=T0_MS, span_ms=2 * DAY_MS, seed=4, image_size=32))
    run_preprocess(lake, "s", PreprocessSettings(threads=2))
    # Scored with k = 5, not the environment's default: a backfill must rescore with the table's own settings.
    first = run_drift(lake, "s", DriftSettings(k=5.0))
    assert first.windows > 0
    tables = StreamTables(lake, "s")
    versions = {t: tables.open(t).version() for t in ("features", "drift")}

    start, end = "2026-01-01T00:00:00Z", "2026-01-03T00:00:00Z"
    settings = LakeSettings(lake=lake)
    cpu = PreprocessSettings(provider="cpu", threads=2)
    plan = BackfillPlan(start=start, end=end)
    forced = backfill(stream="s", plan=plan.model_copy(update={"force": True}), lake=settings, settings=cpu)
    assert [d.rows > 0 for d in forced.days] == [True, True] and forced.rows == 80 * 2 + 20
    # Identical operator bytes: identical features, so the rescored drift windows equal the table's.
    assert "identical" in str(forced.drift_status)
    assert tables.open("drift").version() == versions["drift"]

    features_version = tables.open("features").version()
    rerun = backfill(stream="s", plan=plan, lake=settings, settings=cpu)
    assert rerun.rows == 0 and rerun.skipped_days == 2
    assert str(rerun.drift_status).startswith("features of the range unchanged")
    assert tables.open("features").version() == features_version
    assert tables.open("drift").version() == versions["drift"]

    drift_only = plan.model_copy(update={"stages": "drift"})
    only_drift = backfill(stream="s", plan=drift_only, lake=settings)
    assert only_drift.days == [] and "identical" in str(only_drift.drift_status)

    import anyio

    async def names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(
                    name=FlowRunFilterName(
                        any_=[
                            "backfill s 2026-01-01T00:00:00Z..2026-01-02T00:00:00Z",
                            "backfill s 2026-01-02T00:00:00Z..2026-01-03T00:00:00Z",
                            f"backfill s {start}..{end} (preprocess,drift)",
                        ]
                    )
                )
            )
            return sorted(r.name for r in runs)

    found = anyio.run(names)
    assert found.count(f"backfill s {start}..{end} (preprocess,drift)") == 2  # the parent, run twice
    assert found.count("backfill s 2026-01-01T00:00:00Z..2026-01-02T00:00:00Z") == 2  # a child per day and run

    events = [json.loads(line) for line in (Path(lake) / "_lineage/events.jsonl").read_text().splitlines()]
    parents = [e for e in events if e["job"]["name"] == "backfill.s" and e["eventType"] == "COMPLETE"]
    assert len(parents) == 3 and len({e["run"]["runId"] for e in parents}) == 1  # deterministic run id
    days = {e["run"]["runId"] for e in events if e["job"]["name"] == "backfill-features.s"}
    assert len(days) == 2  # one id per day, the same on the rerun

    # A backfill may move the drift reference: rescored from the samples of the range given, which
    # later rebuilds keep.
    moved = backfill(
        stream="s",
        plan=drift_only,
        lake=settings,
        reference=ReferenceRange(start="2026-01-01T12:00:00Z", end="2026-01-02T12:00:00Z"),
    )
    assert "samples 21..60 (2026-01-01T12:00:00Z..2026-01-02T12:00:00Z)" in str(moved.drift_status)
    assert min(tables.open("drift").to_pyarrow_table().column("first_sample").to_pylist()) == 60
    kept = backfill(stream="s", plan=drift_only, lake=settings)
    assert "identical" in str(kept.drift_status)


def test_backfill_refuses_bad_ranges_and_stages_in_one_line(tmp_path, capsys) -> None:
    from mmlake.flows.cli import main

    lake = str(tmp_path / "lake")
    assert (
        main(
            [
                "backfill",
                "--stream",
                "s",
                "--from",
                "2026-01-01T00:00:00Z",
                "--to",
                "2026-01-01T00:00:00Z",
                "--lake",
                lake,
            ]
        )
        == 1
    )
    assert capsys.readouterr().err.strip() == (
        "mmlake: error: --from must be before --to (got 2026-01-01T00:00:00Z .. 2026-01-01T00:00:00Z)"
    )
    assert (
        main(
            [
                "backfill",
                "--stream",
                "s",
                "--from",
                "2026-01-01T00:00:00Z",
                "--to",
                "2026-01-02T00:00:00Z",
                "--stages",
                "preprocess,train",
                "--lake",
                lake,
            ]
        )
        == 1
    )
    err = capsys.readouterr().err.strip()
    assert err == "mmlake: error: unknown backfill stage(s) train: choose from preprocess, drift"
