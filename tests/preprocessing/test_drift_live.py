"""Drift live from the first window after the reference, through the real tables at the default
settings: generated images, captions and tones -> the embedded broker -> ``run_ingest`` -> raw -> the
ONNX operators -> features -> drift. The change starts 176 samples after the reference ends, inside
what the old 32-window warm-up learnt as normal (the stream that used to raise no alarm at all)."""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from mmlake.ingest import MultimodalProducer, run_ingest, synth

pytestmark = pytest.mark.slow

T0_MS, SPAN_MS = 1_767_225_600_000, 3_600_000
REFERENCE, WINDOW = 1024, 128  # the defaults
AFTER = 176
COUNT = REFERENCE + AFTER + 2 * WINDOW + 48


def test_a_pairing_shuffle_176_samples_after_the_reference_is_found_at_default_settings(
    broker, new_topic, settings, operator_cache
) -> None:
    from mmlake.preprocessing import run_preprocess
    from mmlake.preprocessing.drift import DriftSettings, run_drift
    from mmlake.preprocessing.settings import PreprocessSettings

    topic = new_topic(partitions=2)
    change = REFERENCE + AFTER
    with MultimodalProducer(broker.bootstrap) as producer:
        for part in synth.samples(
            COUNT, start_ms=T0_MS, span_ms=SPAN_MS, seed=5, image_size=32, shuffle_pairs_after=change
        ):
            producer.send(
                topic,
                part.payload,
                part.modality,
                event_time=part.event_time_ms,
                sample_id=part.sample_id,
                content_type=part.content_type,
            )
    ingested = run_ingest(topic, "s", settings.with_overrides(allowed_lateness_s=3600))
    assert ingested.accepted == COUNT * 2 + COUNT // 4 and ingested.dead_lettered == 0
    assert run_preprocess(settings.lake, "s", PreprocessSettings(threads=2)).errors == 0
    defaults = DriftSettings()
    assert (defaults.reference, defaults.window, defaults.warmup) == (REFERENCE, WINDOW, 0)
    summary = run_drift(settings.lake, "s", defaults)
    assert summary.samples == COUNT - REFERENCE and "mi.image-text" in summary.alarms_up

    rows = DeltaTable(f"{settings.lake}/s/drift").to_pyarrow_table().to_pylist()
    # first_sample counts from the stream's first sample; a window's last sample is first + 127.
    before = [r for r in rows if r["first_sample"] + WINDOW - 1 < change]
    assert len({r["first_sample"] for r in before}) == (AFTER - WINDOW) // 16 + 1  # windows wholly before the change
    assert not [r for r in before if r["alarm"] or r["status"] == "beyond"]  # the first windows are scored, quiet
    assert min(r["first_sample"] for r in rows) == REFERENCE
    assert {r["status"] for r in rows if r["first_sample"] == REFERENCE} <= {"ok", "skipped"}  # no warm-up
    mi = [r for r in rows if r["metric"] == "mi.image-text" and r["event"] == "raised"]
    assert mi and mi[0]["first_sample"] + WINDOW - 1 - change <= 2 * WINDOW
