"""open_clip towers exported to ONNX (the encoder operators).

The pinned exporter is TorchScript-based ``torch.onnx.export(..., dynamo=False, opset_version=18)``
under the torch and open-clip-torch versions recorded in the manifest: it gives the same bytes on every
export. Weights come from a local checkpoint (``--clip-weights``) or, without one, from a seeded
initialisation (``torch.manual_seed``), which the features rows label as untrained.

The text tower is exported with a dynamic sequence length: tokens are cut after the longest caption of
a batch instead of being padded to 77. With the causal mask, positions up to the end-of-text token
never see the padding, so the pooled output equals open_clip's ``encode_text`` on the padded tokens
(checked by the parity test); it makes the text path several times faster.
"""

from __future__ import annotations

import io
from typing import Any


def _load(arch: str, seed: int, weights: str | None) -> Any:
    import logging

    import open_clip
    import torch

    torch.manual_seed(seed)
    root = logging.getLogger()
    was_disabled, root.disabled = root.disabled, True  # open_clip warns on the root logger without weights
    try:
        model = open_clip.create_model(arch, pretrained=weights or None)
    finally:
        root.disabled = was_disabled
    return model.eval()


def _image_module(model: Any) -> Any:
    import torch

    class ImageTower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.visual = model.visual

        def forward(self, pixels: torch.Tensor) -> torch.Tensor:
            return self.visual(pixels)

    return ImageTower()


def _text_module(model: Any) -> Any:
    import torch
    import torch.nn.functional as F
    from open_clip.transformer import text_global_pool

    if not getattr(model.transformer, "batch_first", True):
        raise ValueError("text towers with sequence-first transformers are not supported")

    class TextTower(torch.nn.Module):
        """open_clip's encode_text, written so the sequence length stays dynamic in the graph."""

        def __init__(self) -> None:
            super().__init__()
            self.model = model

        @staticmethod
        def _attention(attn: Any, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            batch, _, width = x.shape
            heads = attn.num_heads
            q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, dim=-1)
            q, k, v = (t.reshape(batch, -1, heads, width // heads).transpose(1, 2) for t in (q, k, v))
            scores = (q * (width // heads) ** -0.5) @ k.transpose(-2, -1) + mask
            out = (scores.softmax(dim=-1) @ v).transpose(1, 2).reshape(batch, -1, width)
            return attn.out_proj(out)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            m = self.model
            length = tokens.shape[1]
            mask = m.attn_mask[:length, :length]
            x = m.token_embedding(tokens) + m.positional_embedding[:length]
            for block in m.transformer.resblocks:
                x = x + block.ls_1(self._attention(block.attn, block.ln_1(x), mask))
                x = x + block.ls_2(block.mlp(block.ln_2(x)))
            x = text_global_pool(m.ln_final(x), tokens, m.text_pool_type)
            return x @ m.text_projection

    return TextTower()


def export_tower(params: dict[str, Any], weights: str | None = None) -> bytes:
    """The ONNX bytes of one tower (``params["tower"]`` is ``image`` or ``text``)."""
    import warnings

    import torch

    model = _load(str(params["arch"]), int(params.get("seed", 0)), weights)
    buf = io.BytesIO()
    if params["tower"] == "image":
        size = int(
            model.visual.image_size[0] if isinstance(model.visual.image_size, tuple) else model.visual.image_size
        )
        module, example, name, axes = _image_module(model), torch.zeros(1, 3, size, size), "pixels", {0: "batch"}
    elif params["tower"] == "text":
        module, example, name = _text_module(model), torch.zeros(1, 8, dtype=torch.int64), "tokens"
        axes = {0: "batch", 1: "length"}
    else:
        raise ValueError(f"unknown tower {params['tower']!r}")
    # Not under no_grad: there nn.MultiheadAttention takes a fused fast path the exporter cannot export.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            (example,),
            buf,  # type: ignore[arg-type]
            dynamo=False,
            opset_version=int(params.get("opset", 18)),
            input_names=[name],
            output_names=["embedding"],
            dynamic_axes={name: axes, "embedding": {0: "batch"}},
        )
    return buf.getvalue()


def torch_reference(params: dict[str, Any], weights: str | None = None) -> Any:
    """The open_clip model an exported tower came from (for parity checks and the torch baseline)."""
    return _load(str(params["arch"]), int(params.get("seed", 0)), weights)
