"""The operators themselves: parity with Pillow/torchvision and torch open_clip, determinism, bad input."""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest

from mmlake.ingest.synth import COLOURS, png_image, wav_tone
from mmlake.preprocessing.operators import AUDIO_UNSUPPORTED, IMAGE_UNDECODABLE, TEXT_EMPTY, decode_wav, load, resample
from mmlake.preprocessing.runtime import resolve


def _photo(h: int, w: int, seed: int) -> np.ndarray:
    """A smooth, photo-like image (gradients and blobs) with a little noise."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
    channels = [np.sin(xx * rng.uniform(2, 9) + rng.uniform(0, 6)) * np.cos(yy * rng.uniform(2, 9)) for _ in range(3)]
    img = (np.stack(channels, -1) * 90 + 128 + rng.normal(0, 4, (h, w, 3))).clip(0, 255)
    return img.astype(np.uint8)


def _png(pixels: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def ops(registry, cpu_options):
    return {m: load(spec, registry, cpu_options) for m, spec in registry.default_operators().items()}


# Stated tolerance of the ONNX image graph against open_clip's Pillow/torchvision transform, in 8-bit grey
# levels: Pillow resizes in two passes, rounding to uint8 in between, the graph resizes once in float.
MEAN_LEVELS = 0.35
MAX_LEVELS = 2.001  # (+ float32 rounding of the normalised values)
P999_LEVELS = 1.001


@pytest.mark.parametrize(("h", "w"), [(224, 224), (300, 400), (480, 640), (1000, 333), (64, 80), (225, 301)])
def test_image_graph_matches_pillow_torchvision_within_tolerance(ops, h: int, w: int) -> None:
    import open_clip
    from PIL import Image

    from mmlake.preprocessing.graphs import CLIP_STD

    pixels = _photo(h, w, seed=h * w)
    reference = open_clip.image_transform(224, is_train=False)(Image.fromarray(pixels)).numpy()
    ours = ops["image"].prepare(_png(pixels))
    assert ours.shape == (3, 224, 224)
    levels = np.abs(ours - reference) * np.asarray(CLIP_STD, np.float32)[:, None, None] * 255
    assert levels.mean() <= MEAN_LEVELS
    assert np.quantile(levels, 0.999) <= P999_LEVELS
    assert levels.max() <= MAX_LEVELS
    if (h, w) == (224, 224):
        assert levels.max() < 1e-3  # no resize, no crop: only the normalisation


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / np.linalg.norm(a, axis=-1) / np.linalg.norm(b, axis=-1)


def test_onnx_clip_towers_match_torch_open_clip(ops, registry, cpu_options) -> None:
    import open_clip
    import torch
    from PIL import Image

    from mmlake.preprocessing.clip import torch_reference

    model = torch_reference(registry.models["clip_image@vit-s-32-seed0"].params)
    images = [_photo(200 + 10 * i, 260, seed=i) for i in range(4)]
    transform = open_clip.image_transform(224, is_train=False)
    pixels = torch.stack([transform(Image.fromarray(p)) for p in images])
    with torch.no_grad():
        ref_image = model.encode_image(pixels).numpy()
        tokens = open_clip.get_tokenizer("ViT-S-32")(["a red square on a dark background", "hello", "ÉTÉ", "x " * 100])
        ref_text = model.encode_text(tokens).numpy()
    clip_image = load(registry.operator("image_clip@1"), registry, cpu_options)
    onnx_image = clip_image.encode_prepared(list(pixels.numpy()))
    assert _cosine(onnx_image, ref_image).min() >= 0.9999
    onnx_text = (
        ops["text"]
        .encode([t.encode() for t in ["a red square on a dark background", "hello", "ÉTÉ", "x " * 100]])
        .embeddings
    )
    assert _cosine(onnx_text, ref_text).min() >= 0.9999
    # End to end through our image graph: within the graph's tolerance, the embedding barely moves.
    ours = clip_image.encode([_png(p) for p in images]).embeddings
    assert _cosine(ours, ref_image).min() >= 0.999


def test_the_trained_image_encoder_matches_its_torch_network(ops, registry) -> None:
    import torch

    from mmlake.preprocessing.efficientnet import encoder_module, load_network

    spec = registry.operator("image_efficientnet_lite0@2")
    assert ops["image"].spec == spec and spec.trained, "the trained encoder is the default image operator"
    pixels = np.stack([ops["image"].prepare(_png(_photo(240, 320, seed=i))) for i in range(3)])
    with torch.no_grad():
        reference = encoder_module(load_network(spec.models[-1].params["weights_sha256"]))(torch.from_numpy(pixels))
    ours = ops["image"].encode_prepared(list(pixels))
    assert ours.shape == (3, 1280)
    assert np.abs(ours - reference.numpy()).max() <= 1e-4 * float(np.abs(reference.numpy()).max())


def test_trained_features_tell_scenes_apart_and_keep_near_duplicates_close(ops) -> None:
    from mmlake.cache import CacheSettings
    from mmlake.ingest.synth import AUGMENTATIONS, augment, png_bytes, scene

    threshold = CacheSettings().min_similarity
    rng = np.random.default_rng(5)
    sources = [scene(rng) for _ in range(8)]
    copies = [(i, augment(img, kind, rng)) for i, img in enumerate(sources) for kind in range(len(AUGMENTATIONS))]
    stored = ops["image"].encode([png_bytes(img) for img in sources]).embeddings
    queries = ops["image"].encode([png_bytes(img) for _, img in copies]).embeddings
    stored /= np.linalg.norm(stored, axis=1, keepdims=True)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    between = stored @ stored.T
    np.fill_diagonal(between, -1)
    assert between.max() < threshold, "two different scenes would share a cache entry"
    sims = queries @ stored.T
    truth = np.array([i for i, _ in copies])
    assert (sims.argmax(axis=1) == truth).all(), "every near-duplicate is closest to its own source"
    own = sims[np.arange(len(copies)), truth]
    assert (own >= threshold).mean() >= 0.68, f"near-duplicates above the threshold: {np.round(own, 3)}"


def _payloads() -> dict[str, list[bytes]]:
    rng = np.random.default_rng(7)
    return {
        "image": [png_image(COLOURS["red"], "circle", s, rng) for s in (32, 57, 224, 300)],
        "text": [b"a red circle", "caf\u00e9 au lait".encode(), b"one two three " * 30],
        "audio": [wav_tone(440.0, 0.3), wav_tone(1000.0, 1.1, rate=44_100), wav_tone(220.0, 0.01)],
    }


def test_outputs_are_bitwise_identical_across_runs_and_thread_counts(registry) -> None:
    inputs = _payloads()
    results = []
    for threads in (1, 2, 3, 2):
        options = resolve("cpu", threads, "all")
        results.append(
            {
                m: load(spec, registry, options).encode(inputs[m], batch_size=2).embeddings
                for m, spec in registry.default_operators().items()
            }
        )
    for other in results[1:]:
        for modality, values in results[0].items():
            assert values.tobytes() == other[modality].tobytes(), modality
    assert all(np.abs(v).sum(axis=1).min() > 0 for v in results[0].values())


def test_batch_size_does_not_change_text_embeddings(ops) -> None:
    texts = [b"a", b"a much longer caption about a purple stripe on a dark background", b"two words"]
    one = np.concatenate([ops["text"].encode([t]).embeddings for t in texts])
    together = ops["text"].encode(texts, batch_size=3).embeddings
    assert _cosine(one, together).min() >= 0.99999


def _float_wav() -> bytes:
    samples = np.zeros(800, "<f4").tobytes()
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 3, 1, 16000, 64000, 4, 32)
    return (
        b"RIFF"
        + struct.pack("<I", 36 + len(samples))
        + b"WAVE"
        + fmt
        + b"data"
        + struct.pack("<I", len(samples))
        + samples
    )


def test_bad_payloads_get_a_row_error_and_the_batch_goes_on(ops) -> None:
    good_png = _png(_photo(50, 60, 1))
    image = ops["image"].encode([good_png, b"\x89PNG\r\n\x1a\nnot really", good_png[: len(good_png) // 2], good_png])
    assert [e[0] if e else None for e in image.errors] == [None, IMAGE_UNDECODABLE, IMAGE_UNDECODABLE, None]
    assert "Pillow cannot decode" in image.errors[1][1]
    assert image.embeddings[0].tobytes() == image.embeddings[3].tobytes()
    assert not image.embeddings[1].any()

    text = ops["text"].encode([b"fine", b"", b"  \n\t", b"also fine"])
    assert [e[0] if e else None for e in text.errors] == [None, TEXT_EMPTY, TEXT_EMPTY, None]

    audio = ops["audio"].encode([_float_wav(), wav_tone(300.0, 0.2), b"RIFF....WAVEjunk"])
    codes = [e[0] if e else None for e in audio.errors]
    assert codes[0] == AUDIO_UNSUPPORTED and "PCM integer only" in audio.errors[0][1]
    assert codes[1] is None and codes[2] == "audio_undecodable"


def test_wav_decoding_and_resampling_against_known_signals() -> None:
    samples, rate = decode_wav(wav_tone(1000.0, 0.5, rate=44_100))
    assert rate == 44_100 and samples.size == 22_050
    assert abs(float(np.max(np.abs(samples))) - 0.4) < 1e-3
    out = resample(samples, 44_100, 16_000)
    assert out.size == 8_000
    spectrum = np.abs(np.fft.rfft(out))
    assert abs(np.argmax(spectrum) * 16_000 / out.size - 1000.0) <= 2.0  # the tone stays at 1 kHz


def test_logmel_graph_matches_a_numpy_stft(ops) -> None:
    from mmlake.preprocessing.graphs import mel_filter_bank

    params = ops["audio"].spec.models[0].params
    rng = np.random.default_rng(3)
    signal = rng.normal(0, 0.1, 4000).astype(np.float32)
    graph = ops["audio"].sessions[0].run(None, {"waveform": signal[None, :]})[0][0]
    n_fft, hop = params["n_fft"], params["hop"]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)
    frames = np.stack([signal[i : i + n_fft] * window for i in range(0, signal.size - n_fft + 1, hop)])
    power = np.abs(np.fft.rfft(frames, axis=1)) ** 2
    mel = mel_filter_bank(params["sample_rate"], n_fft, params["n_mels"], params["f_min"], params["f_max"])
    expected = np.log(np.maximum(power @ mel, 1e-10))
    assert graph.shape == expected.shape
    assert np.abs(graph - expected).max() < 1e-3
