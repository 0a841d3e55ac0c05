"""``produce_path``: folders and JSONL manifests into a real topic, and their bad input."""

from __future__ import annotations

import json
import os

import pytest

from mmlake.errors import InputError
from mmlake.ingest import produce_path, run_ingest
from tests.fixtures.data import png, table_rows, wav


def test_folder_joins_parts_by_file_stem(broker, settings, tmp_path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "cat.png").write_bytes(png())
    (folder / "cat.txt").write_text("a cat")
    (folder / "purr.wav").write_bytes(wav())
    (folder / "notes.md").write_text("ignored: unknown extension")
    os.utime(folder / "cat.png", (1_767_225_600, 1_767_225_600))
    assert produce_path(folder, "folder-topic", broker.bootstrap, partitions=2) == 3
    run_ingest("folder-topic", "s", settings)
    rows = table_rows(settings.lake, "s", "raw")
    assert sorted((r["sample_id"], r["modality"]) for r in rows) == [
        ("cat", "image"),
        ("cat", "text"),
        ("purr", "audio"),
    ]
    png_row = next(r for r in rows if r["modality"] == "image")
    assert png_row["event_time"].timestamp() == 1_767_225_600


def test_manifest(broker, settings, tmp_path) -> None:
    (tmp_path / "a.png").write_bytes(png(3))
    lines = [
        {"path": "a.png", "event_time": "2026-01-01T00:00:00Z", "sample_id": "s1"},
        {"text": "caption of s1", "event_time": 1767225600000, "sample_id": "s1", "record_id": "cap-1"},
    ]
    manifest = tmp_path / "m.jsonl"
    manifest.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert produce_path(manifest, "manifest-topic", broker.bootstrap) == 2
    run_ingest("manifest-topic", "s", settings)
    rows = sorted(table_rows(settings.lake, "s", "raw"), key=lambda r: r["modality"])
    assert [(r["modality"], r["sample_id"]) for r in rows] == [("image", "s1"), ("text", "s1")]
    assert rows[1]["record_id"] == "cap-1" and rows[1]["payload"] == b"caption of s1"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "m.jsonl:2: not JSON"),
        ('{"text": "x"}', "m.jsonl:2: missing event_time"),
        ('{"event_time": 1}', "m.jsonl:2: needs 'path' or 'text'"),
        ('{"path": "gone.png", "event_time": 1}', "m.jsonl:2: cannot read"),
        ('{"path": "a.bin", "event_time": 1}', "cannot tell the modality"),
        ('{"text": "x", "event_time": "20260101T000000Z"}', "m.jsonl:2: event_time not RFC 3339"),
        ('{"text": "x", "event_time": 1000000000000000}', "m.jsonl:2: event_time .* outside years 1..9999"),
        ('{"text": "x", "event_time": true}', "m.jsonl:2: event_time must be RFC 3339 text or integer"),
        ('{"text": "x", "event_time": 1, "sample_id": 7}', "m.jsonl:2: sample_id must be a string"),
        ('{"text": "x", "event_time": 1, "modality": "video"}', "m.jsonl:2: modality 'video' is not one of"),
    ],
)
def test_bad_manifest_lines_are_named(broker, tmp_path, line, message) -> None:
    from mmlake.ingest.producer import topic_exists

    (tmp_path / "a.bin").write_bytes(b"?")
    manifest = tmp_path / "m.jsonl"
    manifest.write_text('{"text": "ok", "event_time": 1}\n' + line + "\n")
    topic = f"bad-manifest-{abs(hash(line))}"
    with pytest.raises(InputError, match=message):
        produce_path(manifest, topic, broker.bootstrap)
    assert not topic_exists(broker.bootstrap, topic), (
        "nothing is sent (or created) before the whole manifest is checked"
    )


def test_a_manifest_that_is_not_utf8_is_one_line(broker, tmp_path) -> None:
    manifest = tmp_path / "m.jsonl"
    manifest.write_bytes(b'{"text": "caf\xe9", "event_time": 1}\n')
    with pytest.raises(InputError, match="m.jsonl: not UTF-8 text"):
        produce_path(manifest, "bad-encoding", broker.bootstrap)


def test_missing_path(broker, tmp_path) -> None:
    with pytest.raises(InputError, match="neither a folder nor a manifest"):
        produce_path(tmp_path / "nope", "t", broker.bootstrap)
