"""An inference tier that reuses transformer KV caches from SafeCache.

A small causal transformer (seeded weights, untrained) reads an image-embedding prefix, projected to
``prefix_tokens`` soft tokens, followed by the prompt. Its ``past_key_values`` for the prefix are what
SafeCache stores, keyed by the image embedding. On a hit the server skips the prefix pass; on an exact
hit the logits are bit-for-bit those of recomputing the prefix.

Run: ``.venv/bin/python -m examples.inference_server`` (prints time to first token with and without a hit).
"""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch import nn

Past = list[tuple[torch.Tensor, torch.Tensor]]


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, past: tuple[torch.Tensor, torch.Tensor] | None) -> tuple[torch.Tensor, Any]:
        b, n, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(w, dim=-1)
        q, k, v = (t.view(b, n, self.heads, w // self.heads).transpose(1, 2) for t in (q, k, v))
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        total = k.shape[2]
        # Causal mask over the new positions, which come after the ``total - n`` cached ones.
        mask = torch.ones(n, total, dtype=torch.bool).tril(diagonal=total - n)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(w // self.heads)
        attn = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v
        x = x + self.out(attn.transpose(1, 2).reshape(b, n, w))
        return x + self.mlp(self.norm2(x)), (k, v)


class TinyLM(nn.Module):
    """A causal LM with an image-embedding prefix. Seeded initialisation: it is untrained."""

    def __init__(self, *, embed_dim: int = 512, prefix_tokens: int = 256, width: int = 256, heads: int = 4,
                 layers: int = 4, vocab: int = 512, max_len: int = 1024, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.prefix_tokens, self.width = prefix_tokens, width
        self.prefix = nn.Linear(embed_dim, prefix_tokens * width)
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(max_len, width)
        self.blocks = nn.ModuleList([Block(width, heads) for _ in range(layers)])
        self.head = nn.Linear(width, vocab)
        self.eval()

    def _run(self, x: torch.Tensor, past: Past | None) -> tuple[torch.Tensor, Past]:
        start = 0 if past is None else past[0][0].shape[2]
        x = x + self.positions(torch.arange(start, start + x.shape[1]))
        new_past: Past = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, None if past is None else past[i])
            new_past.append(kv)
        return x, new_past

    @torch.no_grad()
    def prefill(self, image_embedding: torch.Tensor) -> Past:
        """The KV cache of the image prefix (what SafeCache stores)."""
        x = self.prefix(image_embedding).view(1, self.prefix_tokens, self.width)
        return self._run(x, None)[1]

    @torch.no_grad()
    def next_logits(self, prompt: torch.Tensor, past: Past) -> torch.Tensor:
        """Logits of the token after ``prompt``, given the prefix's KV cache."""
        x, _ = self._run(self.tokens(prompt).unsqueeze(0), past)
        return self.head(x[:, -1])


    @torch.no_grad()
    def one_pass_logits(self, image_embedding: torch.Tensor, prompt: torch.Tensor) -> torch.Tensor:
        """The same logits from a single pass over prefix and prompt, without a KV cache."""
        prefix = self.prefix(image_embedding).view(1, self.prefix_tokens, self.width)
        x, _ = self._run(torch.cat([prefix, self.tokens(prompt).unsqueeze(0)], dim=1), None)
        return self.head(x[:, -1])


def past_to_tensors(past: Past) -> dict[str, torch.Tensor]:
    return {f"layer{i}.{name}": t.contiguous() for i, (k, v) in enumerate(past) for name, t in (("k", k), ("v", v))}


def tensors_to_past(tensors: dict[str, torch.Tensor]) -> Past:
    layers = len(tensors) // 2
    return [(tensors[f"layer{i}.k"], tensors[f"layer{i}.v"]) for i in range(layers)]


class InProcessKV:
    """The prefix-KV store of a server that embeds SafeCache."""

    def __init__(self, cache: Any, tenant: str, model_id: str) -> None:
        self.cache, self.tenant, self.model_id = cache, tenant, model_id

    def lookup(self, embedding: np.ndarray) -> Any:
        return self.cache.lookup(self.tenant, self.model_id, embedding)

    def put(self, embedding: np.ndarray, tensors: dict[str, torch.Tensor]) -> Any:
        return self.cache.put(self.tenant, self.model_id, embedding, tensors)


class RemoteKV:
    """The prefix-KV store of a server that talks to ``mmlake cache serve`` (the token names the tenant)."""

    def __init__(self, client: Any, model_id: str) -> None:
        self.client, self.model_id = client, model_id

    def lookup(self, embedding: np.ndarray) -> Any:
        return self.client.lookup(self.model_id, embedding)

    def put(self, embedding: np.ndarray, tensors: dict[str, torch.Tensor]) -> Any:
        return self.client.put(self.model_id, embedding, tensors)


class InferenceServer:
    """Answers prompts about an image, reusing the prefix KV from a store when it may."""

    def __init__(self, model: TinyLM, store: InProcessKV | RemoteKV) -> None:
        self.model, self.store = model, store

    def first_token_logits(self, embedding: np.ndarray, prompt: torch.Tensor) -> tuple[torch.Tensor, bool]:
        """Logits of the first generated token, and whether the prefix KV came from the cache."""
        from mmlake.cache.core import Hit

        found = self.store.lookup(embedding)
        if isinstance(found, Hit):
            return self.model.next_logits(prompt, tensors_to_past(found.tensors)), True
        past = self.model.prefill(torch.as_tensor(embedding, dtype=torch.float32))
        self.store.put(embedding, past_to_tensors(past))
        return self.model.next_logits(prompt, past), False


def main() -> None:
    from mmlake.cache import CacheSettings, SafeCache

    model = TinyLM()
    server = InferenceServer(model, InProcessKV(SafeCache(CacheSettings()), "demo", "tiny-lm-v0"))
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal(512).astype(np.float32)
    prompt = torch.tensor([1, 17, 42, 7])
    print("tiny-lm-v0: seeded initialisation, untrained (the timings are what this shows)")
    t0 = time.perf_counter()
    cold, hit = server.first_token_logits(embedding, prompt)
    t1 = time.perf_counter()
    warm, hit2 = server.first_token_logits(embedding, prompt)
    t2 = time.perf_counter()
    print(f"time to first token without a hit: {1000 * (t1 - t0):.1f} ms (cache hit: {hit})")
    print(f"time to first token with a hit:    {1000 * (t2 - t1):.1f} ms (cache hit: {hit2})")
    print(f"logits identical: {torch.equal(cold, warm)}")


if __name__ == "__main__":
    main()
