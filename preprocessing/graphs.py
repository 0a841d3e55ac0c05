"""Builders of the small operator graphs that are committed as files (``preprocessing/models/``).

Each builder returns the model's bytes; the same code gives the same bytes (``mmlake ops verify``
rebuilds them and compares). Graphs are written with ``onnx.helper`` directly, with the IR version,
producer and opset spelt out, so the bytes depend on this code and not on the installed onnx version.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

#: CLIP's image normalisation (OpenAI's dataset statistics, as open_clip uses them).
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

IR_VERSION = 8
PRODUCER = "mmlake-preprocessing"


def _const(name: str, value: Any, dtype: Any) -> Any:
    from onnx import numpy_helper

    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


def _model(graph: Any, opset: int, version: str) -> bytes:
    from onnx import checker, helper

    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset)], producer_name=PRODUCER, producer_version=version
    )
    model.ir_version = IR_VERSION
    checker.check_model(model, full_check=True)
    return model.SerializeToString(deterministic=True)


def image_preprocess(params: dict[str, Any]) -> bytes:
    """uint8 ``image`` [H, W, 3] -> float32 ``pixels`` [1, 3, S, S], as open_clip's eval transform:

    * resize so the short side is S and the long side ``int(S * long / short)`` (integer division in
      the graph, as torchvision computes it), bicubic (a = -0.5, Pillow's kernel) **with antialias**
      (Resize's ``antialias`` attribute, defined from opset 18 on — hence opset 18), half-pixel centres,
      weights renormalised at the border (``exclude_outside``), result rounded and clipped to 0..255 as
      Pillow's 8-bit output is;
    * center crop to S x S, the offsets rounded half to even (ONNX Round and Python's round agree);
    * scale to 0..1 and normalise with CLIP's mean and standard deviation.
    """
    from onnx import TensorProto, helper

    size = int(params["size"])
    n = helper.make_node
    nodes = [
        n("Shape", ["image"], ["shape"]),
        n("Slice", ["shape", "i0", "i2"], ["hw"]),
        n("ReduceMin", ["hw"], ["short"], keepdims=1),
        n("Mul", ["hw", "size"], ["hw_scaled"]),
        n("Div", ["hw_scaled", "short"], ["new_hw"]),
        n("Concat", ["i1", "i3", "new_hw"], ["sizes"], axis=0),
        n("Cast", ["image"], ["as_float"], to=TensorProto.FLOAT),
        n("Transpose", ["as_float"], ["chw"], perm=[2, 0, 1]),
        n("Unsqueeze", ["chw", "i0"], ["nchw"]),
        n(
            "Resize",
            ["nchw", "", "", "sizes"],
            ["resized"],
            mode="cubic",
            antialias=1,
            cubic_coeff_a=-0.5,
            coordinate_transformation_mode="half_pixel",
            exclude_outside=1,
        ),
        n("Round", ["resized"], ["rounded"]),
        n("Clip", ["rounded", "f0", "f255"], ["levels"]),
        n("Sub", ["new_hw", "size"], ["excess"]),
        n("Cast", ["excess"], ["excess_f"], to=TensorProto.FLOAT),
        n("Div", ["excess_f", "f2"], ["half"]),
        n("Round", ["half"], ["start_f"]),
        n("Cast", ["start_f"], ["start"], to=TensorProto.INT64),
        n("Add", ["start", "size"], ["stop"]),
        n("Slice", ["levels", "start", "stop", "axes_hw"], ["crop"]),
        n("Div", ["crop", "f255"], ["unit"]),
        n("Sub", ["unit", "mean"], ["centred"]),
        n("Div", ["centred", "std"], ["pixels"]),
    ]
    inits = [
        _const("i0", [0], np.int64),
        _const("i1", [1], np.int64),
        _const("i2", [2], np.int64),
        _const("i3", [3], np.int64),
        _const("size", [size], np.int64),
        _const("axes_hw", [2, 3], np.int64),
        _const("f0", 0.0, np.float32),
        _const("f2", 2.0, np.float32),
        _const("f255", 255.0, np.float32),
        _const("mean", np.reshape(CLIP_MEAN, (1, 3, 1, 1)), np.float32),
        _const("std", np.reshape(CLIP_STD, (1, 3, 1, 1)), np.float32),
    ]
    graph = helper.make_graph(
        nodes,
        "image_preprocess",
        [helper.make_tensor_value_info("image", TensorProto.UINT8, ["height", "width", 3])],
        [helper.make_tensor_value_info("pixels", TensorProto.FLOAT, [1, 3, size, size])],
        inits,
    )
    return _model(graph, 18, str(params.get("version", "1")))


def mel_filter_bank(sample_rate: int, n_fft: int, n_mels: int, f_min: float, f_max: float) -> np.ndarray:
    """Triangular filters on the HTK mel scale (mel = 2595 log10(1 + f / 700)), [n_fft // 2 + 1, n_mels],
    each filter's peak 1 (no area normalisation)."""

    def to_mel(f: np.ndarray) -> np.ndarray:
        return 2595.0 * np.log10(1.0 + f / 700.0)

    def to_hz(m: np.ndarray) -> np.ndarray:
        return 700.0 * (10.0 ** (m / 2595.0) - 1.0)

    bins = np.linspace(0.0, sample_rate / 2, n_fft // 2 + 1)
    edges = to_hz(np.linspace(to_mel(np.array(f_min)), to_mel(np.array(f_max)), n_mels + 2))
    lower, centre, upper = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins[None, :] - lower) / (centre - lower)
    falling = (upper - bins[None, :]) / (upper - centre)
    return np.maximum(0.0, np.minimum(rising, falling)).T.astype(np.float32)


def audio_logmel(params: dict[str, Any]) -> bytes:
    """float32 ``waveform`` [1, T] at the pinned sample rate (T >= n_fft) -> ``logmel`` [1, frames, n_mels]:
    STFT (periodic Hann window, one-sided; opset 17 defines STFT), power, mel filter bank, natural log
    with a floor of 1e-10."""
    from onnx import TensorProto, helper

    rate, n_fft, hop, n_mels = (int(params[k]) for k in ("sample_rate", "n_fft", "hop", "n_mels"))
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n_fft) / n_fft)  # periodic Hann
    mel = mel_filter_bank(rate, n_fft, n_mels, float(params["f_min"]), float(params["f_max"]))
    n = helper.make_node
    nodes = [
        n("Unsqueeze", ["waveform", "axis_last"], ["signal"]),
        n("STFT", ["signal", "hop", "window", "n_fft"], ["spectrum"], onesided=1),
        n("Mul", ["spectrum", "spectrum"], ["squares"]),
        n("ReduceSum", ["squares", "axis_last"], ["power"], keepdims=0),
        n("MatMul", ["power", "mel"], ["mel_power"]),
        n("Max", ["mel_power", "floor"], ["floored"]),
        n("Log", ["floored"], ["logmel"]),
    ]
    inits = [
        _const("axis_last", [-1], np.int64),
        _const("hop", hop, np.int64),
        _const("n_fft", n_fft, np.int64),
        _const("window", window, np.float32),
        _const("mel", mel, np.float32),
        _const("floor", 1e-10, np.float32),
    ]
    graph = helper.make_graph(
        nodes,
        "audio_logmel",
        [helper.make_tensor_value_info("waveform", TensorProto.FLOAT, [1, "samples"])],
        [helper.make_tensor_value_info("logmel", TensorProto.FLOAT, [1, "frames", n_mels])],
        inits,
    )
    return _model(graph, 17, str(params.get("version", "1")))


def audio_embed(params: dict[str, Any]) -> bytes:
    """``logmel`` [1, frames, n_mels] -> ``embedding`` [1, dim]: the per-band mean and standard deviation
    over time, projected by a fixed matrix drawn from a seeded normal distribution (scaled by
    1/sqrt(2 n_mels)). Not learned: it puts audio in the encoders' dimension with a pinned, stable map."""
    from onnx import TensorProto, helper

    n_mels, dim, seed = int(params["n_mels"]), int(params["dim"]), int(params["seed"])
    weights = np.random.default_rng(seed).standard_normal((2 * n_mels, dim)) / np.sqrt(2 * n_mels)
    n = helper.make_node
    nodes = [
        n("ReduceMean", ["logmel"], ["mean"], axes=[1], keepdims=1),
        n("Sub", ["logmel", "mean"], ["deviation"]),
        n("Mul", ["deviation", "deviation"], ["squared"]),
        n("ReduceMean", ["squared"], ["variance"], axes=[1], keepdims=1),
        n("Sqrt", ["variance"], ["std"]),
        n("Concat", ["mean", "std"], ["stats3"], axis=-1),
        n("Squeeze", ["stats3", "axis_time"], ["stats"]),
        n("MatMul", ["stats", "weights"], ["embedding"]),
    ]
    inits = [_const("axis_time", [1], np.int64), _const("weights", weights, np.float32)]
    graph = helper.make_graph(
        nodes,
        "audio_embed",
        [helper.make_tensor_value_info("logmel", TensorProto.FLOAT, [1, "frames", n_mels])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, [1, dim])],
        inits,
    )
    return _model(graph, 17, str(params.get("version", "1")))


#: builder name (as the manifest names it) -> function of the model's params returning its bytes.
BUILDERS: dict[str, Callable[[dict[str, Any]], bytes]] = {
    "image_preprocess": image_preprocess,
    "audio_logmel": audio_logmel,
    "audio_embed": audio_embed,
}
