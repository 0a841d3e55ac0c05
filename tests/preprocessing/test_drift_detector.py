"""The detector and the drift runs on generated embedding streams (real Delta tables, no encoders):
change points found, null streams quiet, bad input counted and never alarming, runs incremental."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from mmlake.preprocessing.drift.detector import ERROR, Detector, DriftConfig, Reference
from mmlake.preprocessing.drift.run import run_drift
from mmlake.preprocessing.drift.settings import DriftSettings
from mmlake.preprocessing.drift.streams import stream
from mmlake.preprocessing.errors import DriftStateError
from tests.preprocessing.helpers import write_features

CFG = DriftConfig()


@dataclass(frozen=True)
class Spec:
    name: str
    version: str = "1"
    sha256: str = "ab" * 32


OPS = {"image": Spec("image_clip"), "text": Spec("text_clip"), "audio": Spec("audio_mel")}


def _raised(scenario: str, seed: int, n: int = 4000, change: int = 2600, **kw):
    s = stream(scenario, n, change=change, seed=seed, **kw)
    det = Detector(CFG, Reference.fit(s.slice(0, CFG.reference), CFG))
    rows = det.feed(s.slice(CFG.reference, n))
    # Rows count samples from the end of the reference; the window's last sample, from the stream start:
    return [
        (r["first_sample"] + CFG.reference + CFG.window - 1 - change, r["metric"])
        for r in rows
        if r["event"] == "raised"
    ], rows


def test_pairing_shuffle_is_found_within_two_windows_by_mutual_information() -> None:
    raised, _ = _raised("shuffle", seed=5)
    assert raised and min(d for d, _ in raised) >= 0, raised  # nothing before the change
    first = {m: d for d, m in reversed(raised)}
    assert first["mi.image-text"] <= 2 * CFG.window
    # Marginals do not move: no per-modality metric of image or text fires.
    assert not [
        m
        for _, m in raised
        if m.split(".")[0] in ("entropy", "js", "shift") and "+" not in m and m.split(".")[1] in ("image", "text")
    ], raised


def test_image_covariate_shift_is_found_by_the_image_metrics_only() -> None:
    raised, _ = _raised("covariate", seed=6)
    assert raised and min(d for d, _ in raised) >= 0
    assert raised[0][1].endswith(".image") and raised[0][0] <= 2 * CFG.window
    assert not [m for _, m in raised if m.endswith(".text") or m.startswith("mi.")], raised


@pytest.mark.parametrize("seed", [41, 42])
def test_null_stream_raises_nothing(seed: int) -> None:
    raised, rows = _raised("null", seed=seed, n=6000)
    assert raised == []
    assert not any(r["alarm"] for r in rows)
    assert {r["status"] for r in rows} <= {"warmup", "ok", "beyond", "skipped"}
    # Only the decay rate is skipped, while its MI history fills (nothing is missing here).
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert skipped and all(r["metric"].startswith("mi_decay.") and "MI history" in r["note"] for r in skipped)
    assert len(skipped) == 3 * (CFG.decay_windows - 1)


def test_bad_parts_are_counted_skipped_and_never_alarm() -> None:
    s = stream("null", 4000, seed=7)
    rng = np.random.default_rng(0)
    after = np.arange(len(s)) >= CFG.reference
    # Past the reference: 20% of captions missing, some NaN and zero-norm images, some error rows.
    drop = after & (rng.random(len(s)) < 0.2)
    s.status["text"][drop] = -1
    s.embeddings["text"][drop] = np.nan
    nan_rows = after & (rng.random(len(s)) < 0.05)
    s.embeddings["image"][nan_rows, 3] = np.nan
    s.status["image"][nan_rows] = -2
    zero_rows = after & ~nan_rows & (rng.random(len(s)) < 0.05)
    s.embeddings["image"][zero_rows] = 0.0
    s.status["image"][zero_rows] = -3
    err = after & (rng.random(len(s)) < 0.03)
    s.status["audio"][err & (s.status["audio"] == 0)] = ERROR
    # A stretch where every caption is missing: text metrics are skipped there, never alarmed.
    gap = (np.arange(len(s)) >= 2500) & (np.arange(len(s)) < 2700)
    s.status["text"][gap] = -1
    det = Detector(CFG, Reference.fit(s.slice(0, CFG.reference), CFG))
    rows = det.feed(s.slice(CFG.reference, len(s)))
    assert not any(r["alarm"] for r in rows), [r for r in rows if r["alarm"]][:2]
    skipped = [r for r in rows if r["status"] == "skipped" and r["metric"] == "entropy.text"]
    assert skipped and all(r["value"] is None and "valid text" in r["note"] for r in skipped)
    noted = [r for r in rows if r["metric"] == "entropy.image" and r["note"]]
    assert noted and any("NaN" in r["note"] and "zero-norm" in r["note"] for r in noted)


def test_run_over_the_features_table_is_incremental_and_exactly_once(tmp_path) -> None:
    lake = str(tmp_path)
    settings = DriftSettings(reference=512)
    s = stream("shuffle", 2000, change=1500, seed=8)
    write_features(lake, "st", s.slice(0, 300), OPS)
    first = run_drift(lake, "st", settings, ops=OPS)
    assert first.windows == 0 and "collecting the reference: 300 of 512" in first.status
    write_features(lake, "st", s.slice(300, 1200), OPS)
    a = run_drift(lake, "st", settings, ops=OPS)
    assert a.samples == 1200 - 512 and a.windows > 0 and not a.alarms_up
    assert run_drift(lake, "st", settings, ops=OPS).rows == 0  # nothing new: no rows, no commit
    write_features(lake, "st", s.slice(1200, 2000), OPS)
    b = run_drift(lake, "st", settings, ops=OPS, max_samples=300)
    c = run_drift(lake, "st", settings, ops=OPS)
    assert b.samples + c.samples == 800 and "mi.image-text" in c.alarms_up

    # The same stream in one run: the same rows, byte for byte.
    other = str(tmp_path / "one")
    write_features(other, "st", s, OPS)
    run_drift(other, "st", settings, ops=OPS)
    from deltalake import DeltaTable

    keys = [("first_sample", "ascending"), ("metric", "ascending")]
    pieces = DeltaTable(f"{lake}/st/drift").to_pyarrow_table().sort_by(keys)
    whole = DeltaTable(f"{other}/st/drift").to_pyarrow_table().sort_by(keys)
    assert pieces.num_rows == whole.num_rows > 0 and pieces.equals(whole)
    firsts = pieces.column("first_sample").to_pylist()
    assert len(set(zip(firsts, pieces.column("metric").to_pylist(), strict=True))) == pieces.num_rows

    # Pinned: other settings or another operator refuse to continue; --rebuild starts over.
    with pytest.raises(DriftStateError, match="settings changed.*k 7.0 -> 5.0"):
        run_drift(lake, "st", settings.with_overrides(k=5.0), ops=OPS)
    # Another default operator (an upgrade's new encoder): rescored from a reference refitted on its
    # rows, never stuck; here it has no rows, so the image metrics are not monitored.
    moved = run_drift(lake, "st", settings, ops={**OPS, "image": Spec("image_clip", "2", "cd" * 32)})
    assert moved.status.startswith("the default operator of image changed since the codebooks were fitted")
    assert "image" not in moved.codebooks and moved.rows == DeltaTable(f"{lake}/st/drift").to_pyarrow_table().num_rows
    rebuilt = run_drift(lake, "st", settings.with_overrides(k=5.0), ops=OPS, rebuild=True)
    assert rebuilt.samples == 2000 - 512
    assert DeltaTable(f"{lake}/st/drift").to_pyarrow_table().num_rows == rebuilt.rows
    # Rebuilding again over the same features gives the same rows: no new version.
    version = DeltaTable(f"{lake}/st/drift").version()
    again = run_drift(lake, "st", settings.with_overrides(k=5.0), ops=OPS, rebuild=True)
    assert again.rows == 0 and "identical" in again.status
    assert DeltaTable(f"{lake}/st/drift").version() == version


def test_too_few_embeddings_of_a_modality_leave_it_unmonitored() -> None:
    s = stream("null", 1500, seed=9, audio_every=50)  # 21 audio parts in the reference: fewer than 4 x 16
    ref = Reference.fit(s.slice(0, CFG.reference), CFG)
    assert "audio" not in ref.codebooks and "not monitored" in ref.skipped["audio"]
    assert not any(m.endswith("audio") for m in ref.metrics())


def test_a_rebuild_with_only_the_reference_then_new_samples_continues(tmp_path) -> None:
    lake = str(tmp_path)
    settings = DriftSettings(reference=512)
    s = stream("null", 1000, seed=10)
    write_features(lake, "st", s.slice(0, 512), OPS)
    empty = run_drift(lake, "st", settings, ops=OPS, rebuild=True)
    assert empty.samples == 0 and empty.rows == 0
    write_features(lake, "st", s.slice(512, 1000), OPS)
    more = run_drift(lake, "st", settings, ops=OPS)
    assert more.samples == 1000 - 512 and more.windows == (1000 - 512 - 128) // 16 + 1


@pytest.mark.parametrize("after", [0, 64, 256])
@pytest.mark.parametrize("scenario", ["shuffle", "covariate", "vocabulary"])
def test_a_change_right_after_the_reference_is_found_within_two_windows(scenario: str, after: int) -> None:
    change = CFG.reference + after
    raised, _ = _raised(scenario, seed=11, n=change + 3 * CFG.window, change=change)
    assert raised and min(d for d, _ in raised) >= 0, raised  # nothing before the change
    assert raised[0][0] <= 2 * CFG.window, raised


def test_a_drift_present_from_the_first_window_is_never_learnt_as_normal() -> None:
    _, rows = _raised("covariate", seed=12, n=5000, change=CFG.reference)
    shift = [r for r in rows if r["metric"] == "shift.image"]
    assert shift[1]["event"] == "raised"  # the first two windows confirm it
    assert all(r["alarm"] for r in shift[1:])  # and it stays up for 3,800 samples
    # The old warm-up learnt the first 32 windows as normal: the same drift went unreported.
    legacy = DriftConfig(warmup=32)
    s = stream("covariate", 5000, change=CFG.reference, seed=12)
    old = Detector(legacy, Reference.fit(s.slice(0, legacy.reference), legacy)).feed(s.slice(legacy.reference, 5000))
    assert not [r for r in old if r["metric"] == "shift.image" and r["alarm"]]


def _concat(*parts):
    """Samples one after another, with times and ids renumbered to follow on."""
    from mmlake.preprocessing.drift.detector import Samples

    whole = Samples.concat(list(parts), ["audio", "image", "text"])
    return Samples(
        parts[0].times[0] + np.arange(len(whole), dtype=np.int64) * 100_000,
        [f"c-{i:06d}" for i in range(len(whole))],
        whole.embeddings,
        whole.status,
    )


def test_a_chosen_reference_range_is_pinned_kept_by_a_rebuild_and_refused_when_too_small(tmp_path) -> None:
    from deltalake import DeltaTable

    from mmlake.errors import InputError

    # 400 samples of a shifted image encoder, then a clean stream whose captions shuffle 1,000 samples
    # after the chosen reference ends: the user pins the clean stretch as the reference.
    s = _concat(
        stream("covariate", 400, change=0, seed=13, magnitude=0.8), stream("shuffle", 2400, change=2000, seed=12)
    )
    lo, hi = int(s.times[400]), int(s.times[1424])
    lake = str(tmp_path / "a")
    write_features(lake, "st", s.slice(0, 1000), OPS)
    waiting = run_drift(lake, "st", ops=OPS, reference_range=(lo, hi))
    assert waiting.rows == 0 and "collecting the reference: 600 samples" in waiting.status
    with pytest.raises(InputError, match=r"holds 100 samples .*need at least 256 samples"):
        run_drift(lake, "st", ops=OPS, reference_range=(lo, int(s.times[500])))
    write_features(lake, "st", s.slice(1000, 2800), OPS)
    done = run_drift(lake, "st", ops=OPS, reference_range=(lo, hi))
    assert done.samples == 2800 - 1424 and "samples 401..1424" in done.status
    rows = DeltaTable(f"{lake}/st/drift").to_pyarrow_table().to_pylist()
    assert min(r["first_sample"] for r in rows) == 1424  # counted from the stream's first sample
    assert min(int(r["window_start"].timestamp() * 1e6) for r in rows) >= hi
    raised = [r for r in rows if r["event"] == "raised"]
    ends = [r["first_sample"] + CFG.window - 1 - 2400 for r in raised]
    assert raised and min(ends) >= 0 and min(ends) <= 2 * CFG.window  # shuffle at 400 + 2000
    book = DeltaTable(f"{lake}/st/drift_codebook").to_pyarrow_table().to_pylist()[0]
    assert int(book["reference_from"].timestamp() * 1e6) == lo and int(book["reference_to"].timestamp() * 1e6) == int(
        s.times[1423]
    )

    with pytest.raises(DriftStateError, match="pinned to .*--rebuild"):
        run_drift(lake, "st", ops=OPS, reference_range=(int(s.times[300]), hi))
    with pytest.raises(DriftStateError, match="pinned to"):
        run_drift(lake, "st", ops=OPS, reference_first=True)
    kept = run_drift(lake, "st", ops=OPS, rebuild=True)
    assert "identical" in kept.status  # the same range, the same rows
    first = run_drift(lake, "st", ops=OPS, rebuild=True, reference_first=True)
    assert "samples 1..1024" in first.status and first.samples == 2800 - 1024
    again = run_drift(lake, "st", ops=OPS, rebuild=True)  # the first samples stay chosen now
    assert "identical" in again.status

    # One run over a lake that had every feature from the start: the same rows as the two runs above.
    other = str(tmp_path / "b")
    write_features(other, "st", s, OPS)
    run_drift(other, "st", ops=OPS, reference_range=(lo, hi))
    keys = [("first_sample", "ascending"), ("metric", "ascending")]
    whole = DeltaTable(f"{other}/st/drift").to_pyarrow_table().sort_by(keys).to_pylist()
    assert whole == sorted(rows, key=lambda r: (r["first_sample"], r["metric"]))


def test_a_table_scored_before_the_calibration_continues_with_its_own_settings(tmp_path) -> None:
    lake = str(tmp_path)
    s = stream("null", 2000, seed=14)
    write_features(lake, "st", s.slice(0, 1400), OPS)
    run_drift(lake, "st", DriftSettings(warmup=32), ops=OPS)  # as an earlier release scored it
    write_features(lake, "st", s.slice(1400, 2000), OPS)
    with pytest.raises(DriftStateError, match="warmup 32 -> 0"):
        run_drift(lake, "st", DriftSettings(warmup=0), ops=OPS)  # chosen by the user: refused
    # Only the default changed (an upgrade): a scheduled run goes on with the table's settings.
    later = run_drift(lake, "st", DriftSettings(), ops=OPS)
    assert later.samples == 600 and "scored with the settings it was started with" in later.status
    assert "warmup 32 -> 0" in later.status
