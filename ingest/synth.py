"""A generated multimodal data set (images with captions, short audio clips) for the demo, tests and bench.

Everything is derived from a seed: the same seed gives the same bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import PIL.Image

COLOURS = {
    "red": (220, 40, 40),
    "green": (40, 180, 60),
    "blue": (40, 70, 220),
    "yellow": (230, 210, 40),
    "purple": (140, 50, 170),
    "orange": (240, 140, 30),
}
SHAPES = ("square", "circle", "stripe")


@dataclass(frozen=True)
class SynthPart:
    sample_id: str
    modality: str
    payload: bytes
    event_time_ms: int
    content_type: str


def png_image(colour: tuple[int, int, int], shape: str, size: int, rng: np.random.Generator) -> bytes:
    """A PNG of a coloured shape on noise; ``size`` pixels square."""
    from PIL import Image

    pixels = rng.integers(0, 60, size=(size, size, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:size, 0:size]
    c = size / 2
    if shape == "circle":
        mask = (yy - c) ** 2 + (xx - c) ** 2 < (size / 3) ** 2
    elif shape == "stripe":
        mask = (xx // max(size // 8, 1)) % 2 == 0
    else:
        mask = (abs(yy - c) < size / 3) & (abs(xx - c) < size / 3)
    pixels[mask] = colour
    buf = io.BytesIO()
    Image.fromarray(pixels, "RGB").save(buf, format="PNG", compress_level=1)
    return buf.getvalue()


def wav_tone(freq_hz: float, seconds: float, rate: int = 16_000) -> bytes:
    """A 16-bit mono PCM WAV of a sine tone."""
    t = np.arange(int(seconds * rate)) / rate
    samples = (0.4 * np.sin(2 * np.pi * freq_hz * t) * 32767).astype("<i2").tobytes()
    header = b"RIFF" + struct.pack("<I", 36 + len(samples)) + b"WAVE"
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16)
    return header + fmt + b"data" + struct.pack("<I", len(samples)) + samples


def samples(
    count: int,
    *,
    start_ms: int,
    span_ms: int,
    seed: int = 0,
    image_size: int = 32,
    audio_every: int = 4,
    shuffle_pairs_after: int | None = None,
) -> Iterator[SynthPart]:
    """Yield ``count`` samples in event-time order: an image and its caption, and every
    ``audio_every``-th sample a short tone. From sample ``shuffle_pairs_after`` on, captions describe
    another sample's image (a pairing shuffle: each modality alone looks unchanged)."""
    rng = np.random.default_rng(seed)
    names = list(COLOURS)
    step = span_ms / max(count, 1)
    attrs = [(names[rng.integers(len(names))], SHAPES[rng.integers(len(SHAPES))]) for _ in range(count)]
    for i in range(count):
        sample_id = f"s{seed}-{i:06d}"
        at = start_ms + int(i * step)
        colour, shape = attrs[i]
        yield SynthPart(sample_id, "image", png_image(COLOURS[colour], shape, image_size, rng), at, "image/png")
        cap_colour, cap_shape = colour, shape
        if shuffle_pairs_after is not None and i >= shuffle_pairs_after:
            cap_colour, cap_shape = attrs[int(rng.integers(count))]
        caption = f"a {cap_colour} {cap_shape} on a dark background"
        yield SynthPart(sample_id, "text", caption.encode(), at, "text/plain; charset=utf-8")
        if audio_every and i % audio_every == 0:
            freq = 220.0 * (1 + names.index(colour))
            yield SynthPart(sample_id, "audio", wav_tone(freq, 0.25), at, "audio/wav")


# -- scenes and their near-duplicates (the SafeCache benchmark, the encoder tests, the VLM example) -----

#: What :func:`augment` does, by ``kind``: the near-duplicates an inference tier sees of one image.
AUGMENTATIONS = ("jpeg_q75", "crop_5px", "resize_0.71x_and_back", "colour_shift_8", "brightness_5pct")


def scene(rng: np.random.Generator, size: int = 224) -> PIL.Image.Image:
    """An RGB image of 3-6 filled shapes (ellipses, rectangles, triangles, thick lines) in random
    colours, places and sizes on a plain background of a random colour."""
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (size, size), _colour(rng))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 7))):
        kind = int(rng.integers(0, 4))
        colour = _colour(rng)
        x0, y0 = (int(v) for v in rng.integers(0, size - size // 6, 2))
        w, h = (int(v) for v in rng.integers(size // 8, size // 2, 2))
        box = (x0, y0, min(size, x0 + w), min(size, y0 + h))
        if kind == 0:
            draw.ellipse(box, fill=colour)
        elif kind == 1:
            draw.rectangle(box, fill=colour)
        elif kind == 2:
            draw.polygon([(box[0], box[3]), ((box[0] + box[2]) // 2, box[1]), (box[2], box[3])], fill=colour)
        else:
            draw.line([box[:2], box[2:]], fill=colour, width=int(rng.integers(3, 12)))
    return img


def augment(img: PIL.Image.Image, kind: int, rng: np.random.Generator) -> PIL.Image.Image:
    """A near-duplicate of ``img``, one of :data:`AUGMENTATIONS` (``kind`` indexes it)."""
    from PIL import Image, ImageEnhance

    size = img.width
    if kind == 0:
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=75)
        return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
    if kind == 1:
        return img.crop((5, 5, size - 5, size - 5)).resize((size, size), Image.Resampling.BICUBIC)
    if kind == 2:
        small = int(size * 0.71)
        return img.resize((small, small), Image.Resampling.BILINEAR).resize((size, size), Image.Resampling.BILINEAR)
    if kind == 3:
        shifted = np.asarray(img).astype(np.int16) + rng.integers(-8, 9, 3)
        return Image.fromarray(np.clip(shifted, 0, 255).astype(np.uint8))
    if kind == 4:
        return ImageEnhance.Brightness(img).enhance(1.05 if rng.random() < 0.5 else 0.95)
    raise ValueError(f"augmentation kind {kind} is not one of 0..{len(AUGMENTATIONS) - 1}")


def png_bytes(img: PIL.Image.Image) -> bytes:
    buf = io.BytesIO()
    img.save(buf, "PNG")
    return buf.getvalue()


def _colour(rng: np.random.Generator) -> tuple[int, int, int]:
    r, g, b = (int(c) for c in rng.integers(0, 256, 3))
    return r, g, b
