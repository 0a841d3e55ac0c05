"""A generated multimodal data set (images with captions, short audio clips) for the demo, tests and bench.

Everything is derived from a seed: the same seed gives the same bytes.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

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
