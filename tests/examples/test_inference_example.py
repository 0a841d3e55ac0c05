"""The inference-tier example: reused KV gives the logits of recomputation, in-process and over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmlake.cache import CacheSettings, SafeCache, SafeCacheClient
from examples.inference_server import InferenceServer, InProcessKV, RemoteKV, TinyLM, tensors_to_past, past_to_tensors
from tests.cache.test_server import Server


@pytest.fixture(scope="module")
def model() -> TinyLM:
    return TinyLM(prefix_tokens=32, width=64, layers=2)


def test_exact_hit_logits_equal_recomputation(model) -> None:
    rng = np.random.default_rng(0)
    embedding = rng.standard_normal(512).astype(np.float32)
    prompt = torch.tensor([3, 1, 4, 1, 5])
    server = InferenceServer(model, InProcessKV(SafeCache(CacheSettings()), "t", "tiny"))
    cold, hit_cold = server.first_token_logits(embedding, prompt)
    warm, hit_warm = server.first_token_logits(embedding, prompt)
    assert (hit_cold, hit_warm) == (False, True)
    recomputed = model.next_logits(prompt, model.prefill(torch.as_tensor(embedding)))
    assert torch.equal(warm, recomputed) and torch.equal(cold, recomputed)
    # And the cached path agrees with one pass over prefix + prompt (different kernels: a tolerance).
    full = model.one_pass_logits(torch.as_tensor(embedding), prompt)
    assert torch.allclose(full, warm, atol=1e-4)
    # A different image is not served from this entry.
    other, hit_other = server.first_token_logits(rng.standard_normal(512).astype(np.float32), prompt)
    assert not hit_other and not torch.equal(other, warm)


def test_exact_hit_over_http(model) -> None:
    embedding = np.random.default_rng(1).standard_normal(512).astype(np.float32)
    prompt = torch.tensor([9, 2, 6])
    with Server(SafeCache(CacheSettings())) as running, SafeCacheClient(running.url, "tok-alice") as client:
        server = InferenceServer(model, RemoteKV(client, "tiny"))
        cold, hit_cold = server.first_token_logits(embedding, prompt)
        warm, hit_warm = server.first_token_logits(embedding, prompt)
    assert (hit_cold, hit_warm) == (False, True) and torch.equal(cold, warm)


def test_kv_round_trip_helpers(model) -> None:
    past = model.prefill(torch.zeros(512))
    again = tensors_to_past(past_to_tensors(past))
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(past, again))
