"""Generated embedding streams with known change points, for the drift evaluation and tests.

A sample has a hidden concept (one of ``colours x shapes``). Its image embedding is the sum of the
concept's colour and shape directions in the image space plus noise; its caption's embedding the same
in an independent text space; every ``audio_every``-th sample has an audio embedding that depends on the
colour only. All three share a large common offset (as real encoders' outputs do) and are L2-normalised
(as CLIP embeddings are when compared). Scenarios, from
``change`` on:

- ``null``: nothing changes;
- ``shuffle``: each caption belongs to another sample (its concept is drawn again from the same
  distribution): every marginal is unchanged, the image-text dependence is gone;
- ``covariate``: image embeddings move by ``magnitude`` along a fixed direction (image only);
- ``vocabulary``: captions use new words: each concept's text direction is rotated towards a new one;
- ``gradual``: the image shift of ``covariate`` grows linearly over ``ramp`` samples.
"""

from __future__ import annotations

import numpy as np

from mmlake.preprocessing.drift.detector import Samples

SCENARIOS = ("null", "shuffle", "covariate", "vocabulary", "gradual")


def stream(
    scenario: str,
    n: int,
    *,
    change: int | None = None,
    seed: int = 0,
    dim: int = 384,
    colours: int = 6,
    shapes: int = 3,
    noise: float = 1.2,
    magnitude: float = 0.5,
    ramp: int = 2000,
    audio_every: int = 4,
    t0_us: int = 1_767_225_600_000_000,
    spacing_us: int = 100_000,
) -> Samples:
    if scenario not in SCENARIOS:
        raise ValueError(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    rng = np.random.default_rng(seed)
    # The geometry (directions) is shared by every stream of the same dim; the draws depend on the seed.
    geo = np.random.default_rng(12345)

    def directions(k: int) -> np.ndarray:
        v = geo.standard_normal((k, dim))
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    img_colour, img_shape = directions(colours), directions(shapes)
    txt_colour, txt_shape = directions(colours), directions(shapes)
    aud_colour = directions(colours)
    new_txt_colour, new_txt_shape = directions(colours), directions(shapes)
    offset = 3.0 * directions(1)[0]
    shift = directions(1)[0]

    colour = rng.integers(colours, size=n)
    shape = rng.integers(shapes, size=n)
    cap_colour, cap_shape = colour.copy(), shape.copy()
    change = n // 2 if change is None else change
    after = np.arange(n) >= change
    if scenario == "shuffle":
        cap_colour[after] = rng.integers(colours, size=int(after.sum()))
        cap_shape[after] = rng.integers(shapes, size=int(after.sum()))

    def noisy(base: np.ndarray) -> np.ndarray:
        return base + offset + noise * rng.standard_normal((len(base), dim)) / np.sqrt(dim)

    image = noisy(img_colour[colour] + img_shape[shape])
    txt_c, txt_s = txt_colour[cap_colour], txt_shape[cap_shape]
    if scenario == "vocabulary":
        txt_c[after] = 0.5 * txt_c[after] + 0.866 * new_txt_colour[cap_colour[after]]
        txt_s[after] = 0.5 * txt_s[after] + 0.866 * new_txt_shape[cap_shape[after]]
    text = noisy(txt_c + txt_s)
    audio = noisy(aud_colour[colour])
    if scenario == "covariate":
        image[after] += magnitude * shift
    elif scenario == "gradual":
        grow = np.clip((np.arange(n) - change) / ramp, 0.0, 1.0)[:, None]
        image += magnitude * grow * shift
    image, text, audio = (x / np.linalg.norm(x, axis=1, keepdims=True) for x in (image, text, audio))
    audio[np.arange(n) % audio_every != 0] = np.nan
    times = t0_us + np.arange(n, dtype=np.int64) * spacing_us
    return Samples.build(
        times,
        [f"g{seed}-{i:06d}" for i in range(n)],
        {"image": image.astype(np.float32), "text": text.astype(np.float32), "audio": audio.astype(np.float32)},
    )
