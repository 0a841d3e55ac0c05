"""The operator registry: recorded hashes, byte-for-byte regeneration, refusal of tampered files."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mmlake.preprocessing.errors import OperatorIntegrityError
from mmlake.preprocessing.registry import DEFAULT_MANIFEST, Registry, sha256_hex


def test_every_model_regenerates_byte_for_byte_and_matches_its_recorded_hash(registry: Registry) -> None:
    from mmlake.preprocessing.verify import verify

    results = verify(registry, regenerate=True)
    assert {r.ref for r in results} == set(json.loads(DEFAULT_MANIFEST.read_text())["models"])
    for r in results:
        assert r.ok, r.text()
        assert r.rebuilt == r.recorded
    committed = [m for m in registry.models.values() if m.file]
    assert committed, "the small graphs are committed files"
    for m in committed:
        assert sha256_hex(registry.model_path(m).read_bytes()) == m.sha256


def test_operator_hash_changes_with_any_model_byte(registry: Registry) -> None:
    doc = json.loads(DEFAULT_MANIFEST.read_text())
    doc["models"]["image_preprocess@1"]["sha256"] = "0" * 64
    other = Registry(doc, DEFAULT_MANIFEST.parent, registry.cache_dir)
    assert other.operator("image_clip@1").sha256 != registry.operator("image_clip@1").sha256
    assert other.operator("text_clip@1").sha256 == registry.operator("text_clip@1").sha256


def _copy_registry(tmp_path: Path) -> Path:
    root = tmp_path / "ops"
    shutil.copytree(DEFAULT_MANIFEST.parent / "models", root / "models")
    shutil.copy(DEFAULT_MANIFEST, root / "operators.json")
    return root / "operators.json"


def test_a_tampered_committed_operator_file_is_refused_naming_the_file(
    tmp_path: Path, operator_cache: str, cpu_options
) -> None:
    from mmlake.preprocessing.operators import load

    manifest = _copy_registry(tmp_path)
    target = manifest.parent / "models" / "audio_logmel-1.onnx"
    data = bytearray(target.read_bytes())
    data[-5] ^= 0x01  # one bit of a weight
    target.write_bytes(bytes(data))
    registry = Registry.load(manifest, operator_cache)
    with pytest.raises(OperatorIntegrityError, match="audio_logmel-1.onnx"):
        load(registry.operator("audio_mel@1"), registry, cpu_options)
    # The untouched operators still load.
    assert load(registry.operator("image_clip@1"), registry, cpu_options).dim == 384


def test_a_tampered_generated_encoder_in_the_cache_is_refused(tmp_path: Path, registry: Registry, cpu_options) -> None:
    from mmlake.preprocessing.operators import load

    cache = tmp_path / "cache"
    spec = registry.models["clip_text@vit-s-32-seed0"]
    cache.mkdir()
    good = registry.model_bytes(spec)
    (cache / registry.model_path(spec).name).write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    other = Registry.load(cache_dir=cache)
    with pytest.raises(OperatorIntegrityError, match="clip_text-vit-s-32-seed0.onnx"):
        load(other.operator("text_clip@1"), other, cpu_options)


def test_cli_ops_verify_fails_in_one_line_on_a_tampered_file(tmp_path: Path, operator_cache: str) -> None:
    manifest = _copy_registry(tmp_path)
    target = manifest.parent / "models" / "image_preprocess-1.onnx"
    target.write_bytes(target.read_bytes() + b"\0")
    env = {
        "MMLAKE_PREPROCESS_MANIFEST": str(manifest),
        "MMLAKE_PREPROCESS_CACHE_DIR": operator_cache,
        "PATH": "/usr/bin:/bin",
    }
    proc = subprocess.run(
        [sys.executable, "-m", "mmlake.flows.cli", "ops", "verify", "--no-regenerate"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).parents[2],
        timeout=120,
    )
    assert proc.returncode == 1
    assert "image_preprocess@1" in proc.stdout and "FAILED" in proc.stdout
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors == [errors[0]] and errors[0].startswith(
        f"mmlake: error: 1 of {len(Registry.load().models)} operator models failed"
    )


def test_build_generated_checks_or_pins_each_generated_model(tmp_path: Path) -> None:
    """``mmlake ops build`` (build_generated -> Registry.regenerate): a generated model is rebuilt into
    the cache folder and must reproduce its recorded hash; one without a hash has it pinned on export."""
    from mmlake.preprocessing.build import build_generated

    doc = json.loads(DEFAULT_MANIFEST.read_text())
    small = doc["models"]["image_preprocess@1"]
    doc["models"] = {"image_preprocess@1": {**small, "file": None, "generated": True}}
    doc["operators"], doc["defaults"] = {}, {}
    registry = Registry(doc, DEFAULT_MANIFEST.parent, tmp_path / "cache")
    ((ref, path),) = build_generated(registry)
    assert ref == "image_preprocess@1" and path.parent == tmp_path / "cache"
    assert sha256_hex(path.read_bytes()) == small["sha256"]

    doc["models"]["image_preprocess@1"]["sha256"] = "0" * 64
    with pytest.raises(OperatorIntegrityError, match="regenerating image_preprocess@1 gave SHA-256 9c7f"):
        build_generated(Registry(doc, DEFAULT_MANIFEST.parent, tmp_path / "cache"))

    doc["models"]["image_preprocess@1"]["sha256"] = None  # e.g. a model of a local checkpoint
    pinned = Registry(doc, DEFAULT_MANIFEST.parent, tmp_path / "other")
    build_generated(pinned)
    assert pinned.expected_sha256(pinned.models["image_preprocess@1"]) == small["sha256"]
    assert pinned.model_bytes(pinned.models["image_preprocess@1"]) == path.read_bytes()
