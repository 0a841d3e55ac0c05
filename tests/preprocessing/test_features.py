"""The features table: incremental exactly-once runs, backfills by event-time range, provenance."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from mmlake.lake import StreamTables
from mmlake.preprocessing.backfill import run_backfill
from mmlake.preprocessing.errors import OperatorIntegrityError
from mmlake.preprocessing.incremental import run_preprocess
from mmlake.preprocessing.registry import DEFAULT_MANIFEST, Registry
from mmlake.preprocessing.settings import PreprocessSettings
from tests.preprocessing.helpers import T0_MS, synth_parts, write_raw

DAY_MS = 86_400_000


def _features(lake: str, stream: str = "s") -> pa.Table:
    dt = StreamTables(lake, stream).open("features")
    assert dt is not None
    return dt.to_pyarrow_table().sort_by(
        [("event_time", "ascending"), ("record_id", "ascending"), ("op_name", "ascending"), ("op_version", "ascending")]
    )


def _version(lake: str, stream: str = "s") -> int:
    dt = StreamTables(lake, stream).open("features")
    assert dt is not None
    return dt.version()


@pytest.fixture
def settings(operator_cache: str) -> PreprocessSettings:
    return PreprocessSettings(cache_dir=operator_cache, provider="cpu", threads=2, commit_rows=16, batch_size=8)


def test_incremental_runs_process_each_raw_row_once_with_provenance(tmp_path: Path, settings, registry) -> None:
    lake = str(tmp_path / "lake")
    first = write_raw(lake, "s", synth_parts(12, seed=1))
    summary = run_preprocess(lake, "s", settings)
    assert summary.rows == first.num_rows and summary.errors == 0
    assert summary.commits == -(-first.num_rows // settings.commit_rows)
    assert run_preprocess(lake, "s", settings).rows == 0  # nothing new: nothing written
    second = write_raw(lake, "s", synth_parts(6, seed=2, start_ms=T0_MS + 3 * DAY_MS))
    assert run_preprocess(lake, "s", settings).rows == second.num_rows

    table = _features(lake)
    raw_ids = first.column("record_id").to_pylist() + second.column("record_id").to_pylist()
    assert sorted(table.column("record_id").to_pylist()) == sorted(raw_ids)  # each raw row exactly once
    import onnxruntime

    defaults = registry.default_operators()
    for row in table.to_pylist():
        spec = defaults[row["modality"]]
        assert (row["op_name"], row["op_version"], row["op_sha256"]) == (spec.name, spec.version, spec.sha256)
        assert [m["sha256"] for m in row["op_models"]] == [m.sha256 for m in spec.models]
        assert row["ort_version"] == onnxruntime.__version__
        assert row["execution_provider"] == "CPUExecutionProvider"
        # The image encoder is the trained EfficientNet-Lite0 (1280 wide); text and audio are seeded.
        assert row["encoder_trained"] is (row["modality"] == "image")
        assert len(row["embedding"]) == (1280 if row["modality"] == "image" else 384) and row["error_code"] is None
    # The commit metadata names the job and the runtime options.
    dt = StreamTables(lake, "s").open("features")
    info = [c for c in dt.history() if c.get("mmlake.job") == "preprocess"]
    assert info and json.loads(info[0]["mmlake.runtime"])["intra_op_threads"] == 2


def test_a_run_stopped_part_way_resumes_without_duplicates(tmp_path: Path, settings) -> None:
    lake = str(tmp_path / "lake")
    raw = write_raw(lake, "s", synth_parts(10, seed=3))
    assert run_preprocess(lake, "s", settings, max_rows=7).rows == 7
    rest = run_preprocess(lake, "s", settings)
    assert rest.rows == raw.num_rows - 7
    ids = _features(lake).column("record_id").to_pylist()
    assert len(ids) == len(set(ids)) == raw.num_rows


def test_two_concurrent_runs_write_each_row_once(tmp_path: Path, settings) -> None:
    lake = str(tmp_path / "lake")
    raw = write_raw(lake, "s", synth_parts(16, seed=4))
    results, errors = [], []

    def go() -> None:
        try:
            results.append(run_preprocess(lake, "s", settings))
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=go) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    ids = _features(lake).column("record_id").to_pylist()
    assert len(ids) == len(set(ids)) == raw.num_rows
    assert sum(r.rows for r in results) == raw.num_rows


def test_bad_payloads_become_error_rows_and_nothing_is_skipped(tmp_path: Path, settings) -> None:
    lake = str(tmp_path / "lake")
    parts = synth_parts(3, seed=5) + [
        ("bad-1", "image", b"\x89PNG\r\n\x1a\ntruncated", T0_MS + 10),
        ("bad-2", "text", b"   ", T0_MS + 20),
        ("bad-3", "audio", b"RIFF\x00\x00\x00\x00WAVEfmt nonsense", T0_MS + 30),
    ]
    raw = write_raw(lake, "s", parts)
    summary = run_preprocess(lake, "s", settings)
    assert summary.rows == raw.num_rows and summary.errors == 3
    table = _features(lake)
    bad = table.filter(pc.is_valid(table.column("error_code"))).to_pylist()
    assert sorted((r["sample_id"], r["error_code"]) for r in bad) == [
        ("bad-1", "image_undecodable"),
        ("bad-2", "text_empty"),
        ("bad-3", "audio_undecodable"),
    ]
    assert all(r["embedding"] is None and r["error"] for r in bad)


def _v2_registry(tmp_path: Path, operator_cache: str) -> Registry:
    """The shipped registry plus text_clip@2: the same tower after NFKC instead of NFC normalisation."""
    doc = json.loads(DEFAULT_MANIFEST.read_text())
    v2 = dict(doc["operators"]["text_clip@1"])
    v2["params"] = {**v2["params"], "normalization": "NFKC"}
    doc["operators"]["text_clip@2"] = v2
    return Registry(doc, DEFAULT_MANIFEST.parent, Path(operator_cache))


def test_backfill_replaces_only_its_range_and_a_rerun_changes_nothing(
    tmp_path: Path, settings, operator_cache: str
) -> None:
    lake = str(tmp_path / "lake")
    # Four days of samples; captions end in a circled digit, so NFKC (v2) and NFC (v1) differ.
    parts = [
        (s, m, (p.decode() + " \u2460").encode() if m == "text" else p, t)
        for s, m, p, t in synth_parts(16, seed=6, span_ms=4 * DAY_MS)
    ]
    write_raw(lake, "s", parts)
    run_preprocess(lake, "s", settings)
    before = _features(lake)
    start, end = T0_MS + DAY_MS + DAY_MS // 2, T0_MS + 3 * DAY_MS  # mid day 2 .. start of day 4
    lo, hi = pa.scalar(start * 1000, pa.timestamp("us", tz="UTC")), pa.scalar(end * 1000, pa.timestamp("us", tz="UTC"))

    def inside(t: pa.Table) -> pa.Array:
        return pc.and_(pc.greater_equal(t.column("event_time"), lo), pc.less(t.column("event_time"), hi))

    registry = _v2_registry(tmp_path, operator_cache)
    progress: list[tuple[int, int]] = []
    summary = run_backfill(
        lake,
        "s",
        start,
        end,
        settings,
        operator="text_clip@2",
        registry=registry,
        on_progress=lambda d, t: progress.append((d, t)),
    )
    in_range_text = before.filter(pc.and_(inside(before), pc.equal(before.column("modality"), "text")))
    assert summary.rows == in_range_text.num_rows > 0
    assert progress[0][0] == 0 and progress[-1] == (in_range_text.num_rows, in_range_text.num_rows)

    after = _features(lake)
    is_v2 = pc.and_(pc.equal(after.column("op_name"), "text_clip"), pc.equal(after.column("op_version"), "2"))
    v1 = after.filter(pc.invert(is_v2))
    assert v1.equals(before)  # every row but text_clip@2's, in the range or not, byte-identical
    v2 = after.filter(is_v2)
    assert v2.num_rows == in_range_text.num_rows and pc.all(inside(v2)).as_py()
    assert sorted(v2.column("record_id").to_pylist()) == sorted(in_range_text.column("record_id").to_pylist())
    old = {r["record_id"]: r["embedding"] for r in in_range_text.to_pylist()}
    assert all(r["embedding"] != old[r["record_id"]] for r in v2.to_pylist())  # NFKC really changed the input

    version = _version(lake)
    again = run_backfill(lake, "s", start, end, settings, operator="text_clip@2", registry=registry)
    assert again.rows == 0 and again.skipped_ranges >= 1 and _version(lake) == version  # rerun: no commit
    forced = run_backfill(lake, "s", start, end, settings, operator="text_clip@2", registry=registry, force=True)
    assert forced.rows == v2.num_rows
    assert _features(lake).equals(after)  # recomputed, and byte-identical


def test_backfill_with_the_default_operators_repairs_a_range(tmp_path: Path, settings) -> None:
    lake = str(tmp_path / "lake")
    write_raw(lake, "s", synth_parts(12, seed=8, span_ms=3 * DAY_MS))
    run_preprocess(lake, "s", settings)
    before = _features(lake)
    us = pa.timestamp("us", tz="UTC")
    in_day2 = before.filter(
        pc.and_(
            pc.greater_equal(before.column("event_time"), pa.scalar((T0_MS + DAY_MS) * 1000, us)),
            pc.less(before.column("event_time"), pa.scalar((T0_MS + 2 * DAY_MS) * 1000, us)),
        )
    )
    victim = in_day2.column("record_id")[0].as_py()
    StreamTables(lake, "s").open("features").delete(f"record_id = '{victim}'")  # a row lost from day 2
    assert _features(lake).num_rows == before.num_rows - 1
    summary = run_backfill(lake, "s", T0_MS + DAY_MS, T0_MS + 2 * DAY_MS, settings)
    assert summary.rows == in_day2.num_rows  # the day was recomputed as a whole
    assert _features(lake).equals(before)  # and the lost row is back, byte-identical
    from mmlake.lineage.query import explain_record

    info = explain_record(lake, "s", victim)  # reads the rewritten files (string_view columns) too
    assert (
        info["features"] == 1
        and info["operators"][0][0]
        == in_day2.filter(pc.equal(in_day2.column("record_id"), victim)).column("op_name")[0].as_py()
    )


def test_rows_made_by_other_bytes_under_the_same_version_are_refused(
    tmp_path: Path, settings, operator_cache: str
) -> None:
    lake = str(tmp_path / "lake")
    write_raw(lake, "s", synth_parts(3, seed=9))
    run_preprocess(lake, "s", settings)
    doc = json.loads(DEFAULT_MANIFEST.read_text())
    doc["operators"]["text_clip@1"]["params"]["context_length"] = 40  # same name@version, other behaviour
    changed = Registry(doc, DEFAULT_MANIFEST.parent, Path(operator_cache))
    write_raw(lake, "s", synth_parts(2, seed=10, start_ms=T0_MS + 5 * DAY_MS))
    with pytest.raises(OperatorIntegrityError, match="text_clip@1"):
        run_preprocess(lake, "s", settings, registry=changed)


def test_a_missing_stream_is_one_clear_error(tmp_path: Path, settings) -> None:
    from mmlake.errors import InputError

    with pytest.raises(InputError, match="no raw table"):
        run_preprocess(str(tmp_path / "lake"), "nope", settings)
    with pytest.raises(InputError, match="--from before --to"):
        run_backfill(str(tmp_path / "lake"), "nope", T0_MS + 10, T0_MS, settings)
