"""The drift flow end to end: generated images, captions and tones -> raw -> the ONNX operators ->
features -> drift, as the preprocessing flow's follow-up, with artifact and lineage."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mmlake.ingest.synth import samples
from mmlake.lake import StreamTables
from tests.preprocessing.helpers import T0_MS, write_raw

ROOT = Path(__file__).parents[2]
COUNT, SHUFFLE_AT, SPAN_MS = 720, 520, 3_600_000
WINDOW = 64


@pytest.fixture
def small_windows(monkeypatch, default_lineage):
    """Windows small enough for a 720-sample stream; OpenLineage to the lake's file transport."""
    for key, value in {"REFERENCE": "256", "WINDOW": str(WINDOW), "STEP": "8"}.items():
        monkeypatch.setenv(f"MMLAKE_DRIFT_{key}", value)


def _stream(lake: str, name: str, shuffle: int | None) -> None:
    parts = [
        (p.sample_id, p.modality, p.payload, p.event_time_ms)
        for p in samples(COUNT, start_ms=T0_MS, span_ms=SPAN_MS, seed=3, image_size=48, shuffle_pairs_after=shuffle)
    ]
    write_raw(lake, name, parts)


def _sample_at(us: int) -> float:
    return (us / 1000 - T0_MS) / (SPAN_MS / COUNT)


@pytest.mark.slow
def test_pairing_shuffle_raises_an_alarm_within_two_windows_and_a_null_stream_none(
    prefect_harness, small_windows, tmp_path
) -> None:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from mmlake.flows.preprocess import preprocess_stream
    from mmlake.preprocessing.settings import PreprocessSettings
    from mmlake.settings import LakeSettings

    lake = str(tmp_path / "lake")
    _stream(lake, "shuffled", SHUFFLE_AT)
    _stream(lake, "steady", None)
    cpu = PreprocessSettings(provider="cpu", threads=2)
    results = {
        name: preprocess_stream(stream=name, lake=LakeSettings(lake=lake), settings=cpu, then_drift=True).drift
        for name in ("shuffled", "steady")
    }
    assert results["steady"] is not None and results["shuffled"] is not None

    steady = StreamTables(lake, "steady").open("drift").to_pyarrow_table()
    assert steady.num_rows > 0 and not any(steady.column("alarm").to_pylist())
    assert results["steady"].summary.alarms_up == []

    rows = StreamTables(lake, "shuffled").open("drift").to_pyarrow_table().to_pylist()
    raised = [r for r in rows if r["event"] == "raised"]
    assert raised, "the pairing shuffle raised no alarm"
    ends = [_sample_at(int(r["window_end"].timestamp() * 1e6)) for r in raised]
    assert min(ends) >= SHUFFLE_AT, "an alarm before the change"
    mi = [e for e, r in zip(ends, raised, strict=True) if r["metric"] == "mi.image-text"]
    assert mi and min(mi) - SHUFFLE_AT <= 2 * WINDOW
    assert results["shuffled"].encoder_trained is False
    untrained = results["shuffled"].untrained_modalities
    assert "text" in untrained and "image" not in untrained  # the image encoder is the trained one
    assert len({r["codebook_sha256"] for r in rows}) == 1

    events = [json.loads(line) for line in (Path(lake) / "_lineage/events.jsonl").read_text().splitlines()]
    done = [e for e in events if e["job"]["name"] == "drift-stream.shuffled" and e["eventType"] == "COMPLETE"]
    assert len(done) == 1
    windows = done[0]["run"]["facets"]["mmlake_drift"]["windows"]
    assert any(w["alarm"] and w["metric"] == "mi.image-text" for w in windows)
    assertions = done[0]["inputs"][0]["facets"]["dataQualityAssertions"]["assertions"]
    verdict = {a["assertion"]: a["success"] for a in assertions}
    assert verdict["drift:mi.image-text within its EWMA threshold"] is False
    assert verdict["drift:entropy.image within its EWMA threshold"] is True
    assert done[0]["outputs"][0]["name"].endswith("/shuffled/drift")

    import anyio

    async def artifacts() -> list:
        async with get_client() as client:
            return await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["drift-shuffled"]))
            )

    found = anyio.run(artifacts)
    assert found and "**ALARM**" in found[0].data and "data:image/png;base64," in found[0].data
    assert "UNTRAINED" in found[0].data


def test_drift_cli_errors_are_one_line(tmp_path: Path, operator_cache: str) -> None:
    env = {**os.environ, "MMLAKE_PREPROCESS_CACHE_DIR": operator_cache}
    out = subprocess.run(
        [sys.executable, "-m", "mmlake.flows.cli", "drift", "--stream", "nope", "--lake", str(tmp_path / "lake")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=240,
    )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1].startswith("mmlake: error: stream 'nope' has no features table")
    assert len(out.stderr.strip().splitlines()) == 1
    for args, message in (
        (["--reference-from", "2026-01-01T00:00:00Z"], "a reference range needs both"),
        (
            ["--reference-from", "2026-01-02T00:00:00Z", "--reference-to", "2026-01-01T00:00:00Z"],
            "--reference-from must be before --reference-to",
        ),
    ):
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "mmlake.flows.cli",
                "drift",
                "--stream",
                "s",
                "--lake",
                str(tmp_path / "lake"),
                *args,
            ],
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=env,
            timeout=240,
        )
        lines = out.stderr.strip().splitlines()
        assert out.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"mmlake: error: {message}"), lines
