"""Preprocessing throughput: the ONNX path against plain Pillow + torch open_clip, same inputs, same run.

* images: PNG bytes -> embedding. ONNX path: Pillow decode, the ONNX resize/crop/normalise graph, the
  exported image tower (ONNX Runtime). Torch path: Pillow decode, open_clip's eval transform
  (torchvision), ``model.encode_image`` under ``torch.no_grad``.
* texts: UTF-8 bytes -> embedding. ONNX path: NFC + CLIP BPE, tokens cut to the batch's longest
  caption, the exported text tower. Torch path: open_clip's tokenizer (77 tokens) and ``encode_text``.
* images_trained: the default image operator (the trained EfficientNet-Lite0). ONNX path: as for
  images; torch path: Pillow decode, open_clip's eval transform, the timm network with the package's
  weights (the module the ONNX graph was exported from).

Both use the same thread count (torch.set_num_threads = ORT intra-op threads) and the same seeded
ViT-S-32 weights. Batch sizes 1, 8 and 32; each (path, batch size) is timed ``repeats`` times,
interleaved, and the median reported. Ratio = ONNX items/s over torch items/s; target >= 1.0.
"""

from __future__ import annotations

import io
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np

TARGET = 1.0
BATCH_SIZES = (1, 8, 32)


def _images(count: int) -> list[bytes]:
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for i in range(count):
        h, w = (240, 320) if i % 2 else (480, 360)
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        img = np.stack([np.sin(xx * rng.uniform(2, 9)) * np.cos(yy * rng.uniform(2, 9)) for _ in range(3)], -1)
        pixels = (img * 90 + 128 + rng.normal(0, 4, (h, w, 3))).clip(0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="PNG", compress_level=1)
        out.append(buf.getvalue())
    return out


def _texts(count: int) -> list[bytes]:
    from mmlake.ingest.synth import COLOURS, SHAPES

    colours = list(COLOURS)
    return [
        f"a {colours[i % len(colours)]} {SHAPES[i % len(SHAPES)]} on a dark background, photo {i}".encode()
        for i in range(count)
    ]


def _timed(fn: Any, items: list[bytes], batch: int) -> tuple[float, np.ndarray]:
    start = time.perf_counter()
    outs = [fn(items[i : i + batch]) for i in range(0, len(items), batch)]
    return time.perf_counter() - start, np.concatenate(outs)


def run(images: int = 64, texts: int = 128, repeats: int = 3) -> dict[str, Any]:
    import open_clip
    import torch
    from PIL import Image

    from mmlake.preprocessing.clip import torch_reference
    from mmlake.preprocessing.operators import load
    from mmlake.preprocessing.registry import Registry
    from mmlake.preprocessing.runtime import resolve

    threads = min(os.cpu_count() or 1, 8)
    torch.set_num_threads(threads)
    options = resolve("cpu", threads, "all")
    registry = Registry.load(
        cache_dir=os.environ.get("MMLAKE_PREPROCESS_CACHE_DIR")
        or os.path.join(tempfile.gettempdir(), "mmlake-bench-operators")
    )
    image_op = load(registry.operator("image_clip@1"), registry, options)
    text_op = load(registry.operator("text_clip@1"), registry, options)
    model = torch_reference(registry.models["clip_image@vit-s-32-seed0"].params)
    transform = open_clip.image_transform(224, is_train=False)
    tokenizer = open_clip.get_tokenizer("ViT-S-32")

    def torch_images(batch: list[bytes]) -> np.ndarray:
        pixels = torch.stack([transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in batch])
        with torch.no_grad():
            return model.encode_image(pixels).numpy()

    def torch_texts(batch: list[bytes]) -> np.ndarray:
        with torch.no_grad():
            return model.encode_text(tokenizer([b.decode() for b in batch])).numpy()

    def onnx_images(batch: list[bytes]) -> np.ndarray:
        return image_op.encode(batch, batch_size=len(batch)).embeddings

    def onnx_texts(batch: list[bytes]) -> np.ndarray:
        return text_op.encode(batch, batch_size=len(batch)).embeddings

    from mmlake.preprocessing.efficientnet import encoder_module, load_network

    trained_spec = registry.operator("image_efficientnet_lite0@2")
    trained_op = load(trained_spec, registry, options)
    trained = encoder_module(load_network(trained_spec.models[-1].params["weights_sha256"]))

    def torch_trained(batch: list[bytes]) -> np.ndarray:
        pixels = torch.stack([transform(Image.open(io.BytesIO(b)).convert("RGB")) for b in batch])
        with torch.no_grad():
            return trained(pixels).numpy()

    def onnx_trained(batch: list[bytes]) -> np.ndarray:
        return trained_op.encode(batch, batch_size=len(batch)).embeddings

    workloads = {
        "images": (_images(images), torch_images, onnx_images),
        "texts": (_texts(texts), torch_texts, onnx_texts),
        "images_trained": (_images(images), torch_trained, onnx_trained),
    }
    report: dict[str, Any] = {
        "target_ratio": TARGET,
        "threads": threads,
        "model": "ViT-S-32 (seeded, untrained); images_trained: "
        "EfficientNet-Lite0 (trained, the default image operator)",
        "ort_version": options.ort_version,
        "torch_version": torch.__version__,
    }
    for name, (items, reference, ours) in workloads.items():
        reference(items[:2])
        ours(items[:2])  # warm both paths
        rows = {}
        for batch in BATCH_SIZES:
            t_torch, t_onnx = [], []
            for _ in range(repeats):
                seconds, ref = _timed(reference, items, batch)
                t_torch.append(seconds)
                seconds, out = _timed(ours, items, batch)
                t_onnx.append(seconds)
            cosine = (ref * out).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(out, axis=1)
            torch_rate = len(items) / statistics.median(t_torch)
            onnx_rate = len(items) / statistics.median(t_onnx)
            rows[str(batch)] = {
                "torch_per_s": round(torch_rate, 1),
                "onnx_per_s": round(onnx_rate, 1),
                "ratio": round(onnx_rate / torch_rate, 3),
                "min_cosine": round(float(cosine.min()), 6),
            }
        report[name] = {
            "count": len(items),
            "by_batch_size": rows,
            "meets_target": all(r["ratio"] >= TARGET for r in rows.values()),
        }
    return report
