"""Embeddings with a chosen cosine to a reference, a clock the tests move by hand, and a real
uvicorn server on loopback around a SafeCache."""

from __future__ import annotations

import threading
import time

import numpy as np
import torch

from mmlake.cache import SafeCache
from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.server import Tokens, create_app
from mmlake.ingest.broker import free_port

TOKENS = Tokens({"tok-alice": "alice", "tok-bob": "bob"}, operators=frozenset({"tok-ops"}))


class Clock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def unit(rng: np.random.Generator, dim: int = 64) -> np.ndarray:
    v = rng.standard_normal(dim).astype(np.float64)
    return v / np.linalg.norm(v)


def at_cosine(ref: np.ndarray, cosine: float, rng: np.random.Generator, lsh: HyperplaneLSH | None = None) -> np.ndarray:
    """A unit vector whose cosine with unit ``ref`` is exactly ``cosine`` (in float64). With ``lsh``,
    one that also shares ``ref``'s bucket in table 0, so the test is about the threshold, not LSH recall."""
    for _ in range(10_000):
        other = rng.standard_normal(ref.size)
        other -= other.dot(ref) * ref
        other /= np.linalg.norm(other)
        q = cosine * ref + np.sqrt(1 - cosine**2) * other
        if lsh is None or lsh.keys(q.astype(np.float32))[0] == lsh.keys(ref.astype(np.float32))[0]:
            return q
    raise AssertionError("no vector at that cosine shares the bucket")


def kv(seed: int, nbytes: int = 4096) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = nbytes // 8  # two float32 tensors
    return {"k": torch.randn(n, generator=g), "v": torch.randn(n, generator=g)}


class Server:
    def __init__(self, cache: SafeCache, tokens: Tokens | None = None) -> None:
        import uvicorn

        self.cache = cache
        self.port = free_port()
        config = uvicorn.Config(
            create_app(cache, tokens or TOKENS), host="127.0.0.1", port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def body(embedding, tensors, **metadata) -> bytes:
    """A ``POST /v1/kv`` body: the tensors plus ``embedding`` as safetensors, ``metadata`` as strings."""
    from safetensors.torch import save

    return save(
        {**tensors, "embedding": torch.as_tensor(np.asarray(embedding, dtype=np.float32))},
        metadata={k: str(v) for k, v in metadata.items()} or None,
    )
