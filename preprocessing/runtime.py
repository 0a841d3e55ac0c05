"""ONNX Runtime sessions with pinned, recorded options.

* Execution provider chosen at run time (``auto``: CUDA where ORT has it and a device answers, else
  CPU) and then used **without fallback**: a CUDA session is created with CPU fallback disabled, so a
  graph that cannot run there fails instead of quietly running elsewhere.
* Thread counts set explicitly (intra-op N, inter-op 1, sequential execution). On CPU, ORT's kernels
  used here split work by output, so results are bitwise identical across thread counts (tested).
* Graph optimisation level pinned; ``use_deterministic_compute`` on (it picks deterministic CUDA
  kernels where there is a choice).

The small preprocessing graphs always run on CPU: they cost little and their uint8 rounding steps are
then identical everywhere; the encoders run on the chosen provider.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from mmlake.preprocessing.errors import ProviderUnavailableError

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
OPT_LEVELS = ("disabled", "basic", "extended", "all")


@dataclass(frozen=True)
class RuntimeOptions:
    """The session options a run used; recorded in its lineage and commit metadata."""

    provider: str
    intra_op_threads: int
    graph_optimization: str
    ort_version: str
    #: Whether the encoder's threads spin between runs (faster back-to-back batches). An inference server
    #: that runs its own model between lookups turns it off: spinning threads would take its cores.
    spin: bool = True

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "intra_op_threads": self.intra_op_threads,
            "inter_op_threads": 1,
            "graph_optimization": self.graph_optimization,
            "ort_version": self.ort_version,
            "deterministic_compute": True,
        }


def cuda_usable() -> bool:
    import onnxruntime as ort

    if CUDA not in ort.get_available_providers():
        return False
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def resolve(provider: str = "auto", threads: int = 0, graph_optimization: str = "all") -> RuntimeOptions:
    """Turn the user's choices into explicit options: ``provider`` is auto, cpu or cuda; ``threads`` 0
    means min(CPU count, 8), fixed now so it is recorded."""
    import onnxruntime as ort

    if graph_optimization not in OPT_LEVELS:
        raise ValueError(f"graph optimisation must be one of {', '.join(OPT_LEVELS)}, not {graph_optimization!r}")
    choice = provider.lower()
    if choice == "auto":
        chosen = CUDA if cuda_usable() else CPU
    elif choice == "cpu":
        chosen = CPU
    elif choice == "cuda":
        if not cuda_usable():
            raise ProviderUnavailableError(
                "execution provider cuda asked for, but ONNX Runtime here has no usable CUDA provider "
                f"(available: {', '.join(ort.get_available_providers())}); use --provider cpu or auto"
            )
        chosen = CUDA
    else:
        raise ValueError(f"execution provider must be auto, cpu or cuda, not {provider!r}")
    count = threads if threads > 0 else min(os.cpu_count() or 1, 8)
    return RuntimeOptions(chosen, count, graph_optimization, ort.__version__)


def session(model: bytes, options: RuntimeOptions, *, cpu_only: bool = False) -> Any:
    """An InferenceSession over ``model``'s bytes (the bytes whose hash was checked)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    # The small preprocessing graphs get one thread: they run per item between Python decoding steps,
    # where a second pool would only contend with the encoder's. No pool spins while Python works.
    so.intra_op_num_threads = 1 if cpu_only else options.intra_op_threads
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if options.spin and not cpu_only else "0")
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = {
        "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
        "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    }[options.graph_optimization]
    so.use_deterministic_compute = True
    so.log_severity_level = 3
    if options.provider == CUDA and not cpu_only:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        providers: list[Any] = [(CUDA, {"cudnn_conv_algo_search": "DEFAULT", "use_tf32": "0"})]
    else:
        providers = [CPU]
    return ort.InferenceSession(model, so, providers=providers)
