"""SafeCache for Hugging Face transformers: a model's KV cache as named tensors, and prefix reuse.

* :func:`to_tensors` / :func:`from_tensors`: a ``transformers.DynamicCache`` as a flat dict of tensors
  (what SafeCache stores and serves) and back. Names, dtypes, shapes and values round-trip exactly,
  for the layer classes of the pinned transformers release that hold plain tensors: full attention
  (``DynamicLayer``) and sliding-window attention (``DynamicSlidingWindowLayer``, with its window and
  the count of tokens it has seen). Any other layer class (quantised, offloaded, static, linear
  attention) is refused with a clear error rather than stored in a form that would not come back.
* :func:`reuse_prefix`: given a model, the inputs of a prefix (an image's tokens and the system
  prompt), the image's embedding and a :class:`~mmlake.cache.SafeCache` or
  :class:`~mmlake.cache.SafeCacheClient`, the KV cache of that prefix: from the cache on a hit,
  computed (and stored) on a miss. The caller continues from it (:func:`greedy`).

What may be reused is decided by three things, none of them by similarity alone. The ``model_id``
names the weights (KV of one model is meaningless to another). The *salt* is a digest of the prefix's
token ids (the template, the system prompt and the count of image placeholder tokens), so only a
prefix with exactly the same text can match; the stored entry carries those ids again and a hit whose
ids differ is treated as a miss. The embedding's cosine against the server's threshold decides between
images. An exact hit (the same image) gives bit-for-bit the logits of computing the prefix; a hit on
another image above the threshold is an approximation (see docs/cache.md for how far it moves the
next-token distribution).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mmlake.cache.core import Hit, SafeCache
from mmlake.cache.errors import BadRequestError

if TYPE_CHECKING:
    import torch
    from transformers import DynamicCache

    from mmlake.cache.client import SafeCacheClient

#: Tensor names: ``layers.<i>.keys`` / ``.values`` ([batch, kv heads, tokens, head dim]); for a
#: sliding-window layer also ``.sliding_window`` and ``.cumulative_length`` (int64 scalars).
_KEYS, _VALUES, _WINDOW, _SEEN = "keys", "values", "sliding_window", "cumulative_length"
#: The prefix's token ids, stored beside the KV so a hit can be checked against the request.
PREFIX_IDS = "mmlake.prefix_ids"


def to_tensors(past_key_values: Any) -> dict[str, torch.Tensor]:
    """The KV cache ``past_key_values`` (a ``DynamicCache``) as named tensors (see the module docstring)."""
    import torch
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    layers = getattr(past_key_values, "layers", None)
    if layers is None:
        raise TypeError(f"expected a transformers DynamicCache, got {type(past_key_values).__name__}")
    out: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(layers):
        kind = type(layer)
        if kind not in (DynamicLayer, DynamicSlidingWindowLayer):
            raise TypeError(
                f"layer {i} is a {kind.__name__}: only DynamicLayer and DynamicSlidingWindowLayer "
                "hold plain tensors SafeCache can store"
            )
        if not layer.is_initialized or layer.keys is None or layer.keys.numel() == 0:
            raise ValueError(f"layer {i} holds no keys yet: run the prefix through the model first")
        out[f"layers.{i}.{_KEYS}"] = layer.keys.contiguous()  # a sliding window holds a slice
        out[f"layers.{i}.{_VALUES}"] = layer.values.contiguous()
        if kind is DynamicSlidingWindowLayer:
            out[f"layers.{i}.{_WINDOW}"] = torch.tensor(int(layer.sliding_window), dtype=torch.int64)
            out[f"layers.{i}.{_SEEN}"] = torch.tensor(int(layer.cumulative_length), dtype=torch.int64)
    if not out:
        raise ValueError("the cache has no layers")
    return out


def from_tensors(tensors: Mapping[str, torch.Tensor], device: Any = None) -> DynamicCache:
    """A ``DynamicCache`` holding copies of the KV in ``tensors`` (as :func:`to_tensors` names them),
    on ``device`` if given (a SafeCache GPU tier may hand back tensors on another device than the
    model's); other names (such as :data:`PREFIX_IDS`) are ignored. Continuing from it never changes
    ``tensors``."""
    import torch
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    count = 0
    while f"layers.{count}.{_KEYS}" in tensors:
        count += 1
    if count == 0:
        raise BadRequestError("the tensors hold no KV cache (no layers.0.keys)")
    data: list[tuple[torch.Tensor, ...]] = []
    seen: dict[int, int] = {}
    for i in range(count):
        keys, values = tensors[f"layers.{i}.{_KEYS}"], tensors.get(f"layers.{i}.{_VALUES}")
        if device is not None:
            keys, values = keys.to(device), None if values is None else values.to(device)
        if values is None or values.shape[:-1] != keys.shape[:-1] or keys.dim() != 4:
            raise BadRequestError(
                f"layer {i}: keys {tuple(keys.shape)} and values "
                f"{None if values is None else tuple(values.shape)} are not a KV pair"
            )
        window = tensors.get(f"layers.{i}.{_WINDOW}")
        if window is None:
            data.append((keys, values))
        else:
            data.append((keys, values, window.to(torch.int64)))
            seen[i] = int(tensors[f"layers.{i}.{_SEEN}"])
    cache = DynamicCache(ddp_cache_data=data)
    for i, length in seen.items():  # update() counted only the tokens still inside the window
        layer = cache.layers[i]
        assert isinstance(layer, DynamicSlidingWindowLayer)
        layer.cumulative_length = length
    return cache


def prefix_salt(input_ids: torch.Tensor) -> str:
    """The SafeCache salt of a prefix: a digest of its token ids (dtype, shape and values)."""
    ids = input_ids.detach().cpu().to(dtype=input_ids.dtype).contiguous()
    digest = hashlib.sha256(f"{ids.dtype}:{tuple(ids.shape)}:".encode())
    digest.update(ids.numpy().tobytes())
    return "prefix-" + digest.hexdigest()[:32]


@dataclass
class Reused:
    """The KV cache of a prefix and where it came from."""

    cache: DynamicCache
    hit: bool
    similarity: float | None  # the hit's similarity, or the best one seen on a miss
    entry_id: str | None
    reason: str  # why it missed (or "hit")
    stored: bool = False  # a miss whose KV was stored


def _tenant(tenant: str | None) -> str:
    """The tenant an in-process SafeCache needs (a client's token names it instead)."""
    if tenant is None:
        raise BadRequestError("an in-process SafeCache needs the tenant")
    return tenant


def _lookup(
    store: SafeCache | SafeCacheClient,
    tenant: str | None,
    model_id: str,
    embedding: Any,
    salt: str,
    min_similarity: float | None,
) -> Any:
    if isinstance(store, SafeCache):
        return store.lookup(_tenant(tenant), model_id, embedding, min_similarity=min_similarity, salt=salt)
    return store.lookup(model_id, embedding, min_similarity=min_similarity, salt=salt)


def store_prefix(
    store: SafeCache | SafeCacheClient,
    kv: DynamicCache | Mapping[str, torch.Tensor],
    input_ids: torch.Tensor,
    embedding: Any,
    *,
    model_id: str,
    tenant: str | None = None,
    ttl_s: float | None = None,
) -> bool:
    """Store the KV of the prefix ``input_ids`` (a ``DynamicCache`` holding only the prefix, or what
    :func:`to_tensors` made of it before the cache went on) under ``embedding``; whether it was admitted."""
    named = dict(kv) if isinstance(kv, Mapping) else to_tensors(kv)
    tensors = {**named, PREFIX_IDS: input_ids.detach().cpu().contiguous()}
    salt = prefix_salt(input_ids)
    if isinstance(store, SafeCache):
        return store.put(_tenant(tenant), model_id, embedding, tensors, ttl_s=ttl_s, salt=salt).admitted
    return bool(store.put(model_id, embedding, tensors, ttl_s=ttl_s, salt=salt).get("admitted"))


def compute_prefix(model: Any, prefix_inputs: Mapping[str, Any]) -> DynamicCache:
    """Run the prefix through ``model`` and return its KV cache (logits only for the last position)."""
    import torch
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(**prefix_inputs, cache=cache, use_cache=True, logits_to_keep=1)
    return cache


def reuse_prefix(
    model: Any,
    prefix_inputs: Mapping[str, Any],
    embedding: Any,
    store: SafeCache | SafeCacheClient,
    *,
    model_id: str,
    tenant: str | None = None,
    min_similarity: float | None = None,
    ttl_s: float | None = None,
    store_on_miss: bool = True,
) -> Reused:
    """The KV cache of the prefix ``prefix_inputs`` (``input_ids`` and e.g. ``pixel_values``): looked up
    by ``embedding`` among entries of ``model_id`` with the same prefix token ids; on a miss computed
    with ``model`` and, with ``store_on_miss``, stored (a server that wants its first token sooner
    passes False and calls :func:`store_prefix` after answering)."""
    input_ids = prefix_inputs["input_ids"]
    salt = prefix_salt(input_ids)
    found = _lookup(store, tenant, model_id, embedding, salt, min_similarity)
    if isinstance(found, Hit):
        stored_ids = found.tensors.get(PREFIX_IDS)
        if (
            stored_ids is not None
            and stored_ids.shape == input_ids.shape
            and bool((stored_ids.cpu() == input_ids.cpu()).all())
        ):
            return Reused(
                from_tensors(found.tensors, getattr(model, "device", None)), True, found.similarity, found.id, "hit"
            )
        reason = "the entry's prefix token ids differ from the request's"
        similarity: float | None = found.similarity
    else:
        reason, similarity = found.reason, found.best_similarity
    cache = compute_prefix(model, prefix_inputs)
    stored = (
        store_prefix(store, cache, input_ids, embedding, model_id=model_id, tenant=tenant, ttl_s=ttl_s)
        if store_on_miss
        else False
    )
    return Reused(cache, False, similarity, None, reason, stored)


def next_logits(model: Any, cache: DynamicCache, input_ids: torch.Tensor) -> torch.Tensor:
    """The logits after ``input_ids`` (the prompt after the prefix), continuing from ``cache`` (which
    grows by those tokens): [batch, vocab] for the last position."""
    import torch

    with torch.inference_mode():
        out = model(input_ids=input_ids, cache=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1, :]


def greedy(
    model: Any,
    cache: DynamicCache,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    on_first: Callable[[], None] | None = None,
) -> tuple[list[int], torch.Tensor]:
    """Greedy decoding of one sequence after the prefix in ``cache``: the new token ids and the logits
    of the first step (the ones time to first token waits for; ``on_first`` is called once they are
    there)."""
    import torch

    logits = next_logits(model, cache, input_ids)
    if on_first is not None:
        on_first()
    first = logits.clone()
    tokens: list[int] = []
    for _ in range(max_new_tokens):
        token = int(torch.argmax(logits[0]))
        tokens.append(token)
        if len(tokens) == max_new_tokens:
            break
        logits = next_logits(model, cache, torch.tensor([[token]], dtype=input_ids.dtype))
    return tokens, first
