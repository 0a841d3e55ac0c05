"""SafeCache in front of a real transformers engine: the KV glue, the prefix helper, the LLaVA example."""

from __future__ import annotations

import base64
import json

import httpx
import numpy as np
import pytest
import torch

from examples.vlm_server import IMAGE, ImageEmbedder, VisionLanguageServer, build_model, demo_images, serve
from mmlake.cache import CacheSettings, Hit, Miss, SafeCache, SafeCacheClient
from mmlake.cache.hf import PREFIX_IDS, compute_prefix, from_tensors, greedy, prefix_salt, reuse_prefix, to_tensors
from tests.cache.helpers import Server


@pytest.fixture(scope="module")
def model():
    return build_model(256, seed=0, text_layers=2, width=128)


@pytest.fixture(scope="module")
def embedder(operator_cache):
    return ImageEmbedder()


def _small_lm(sliding_window: int | None = None, dtype: torch.dtype = torch.float32):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(1)
    common = {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 97,
    }
    if sliding_window is None:
        return LlamaForCausalLM(LlamaConfig(**common)).eval().to(dtype)
    return MistralForCausalLM(MistralConfig(**common, sliding_window=sliding_window)).eval().to(dtype)


@pytest.mark.parametrize(
    ("sliding_window", "dtype"),
    [(None, torch.float32), (None, torch.bfloat16), (None, torch.float16), (6, torch.float32)],
)
def test_kv_round_trips_names_dtypes_shapes_and_values(sliding_window, dtype) -> None:
    from transformers.cache_utils import DynamicSlidingWindowLayer

    lm = _small_lm(sliding_window, dtype)
    ids = torch.arange(1, 12).unsqueeze(0)
    cache = compute_prefix(lm, {"input_ids": ids})
    tensors = to_tensors(cache)
    expected_names = {f"layers.{i}.{kind}" for i in range(3) for kind in ("keys", "values")}
    if sliding_window:
        expected_names |= {f"layers.{i}.{kind}" for i in range(3) for kind in ("sliding_window", "cumulative_length")}
    assert set(tensors) == expected_names
    assert tensors["layers.0.keys"].dtype == dtype and tensors["layers.0.keys"].shape[:3] == (
        1,
        2,
        min(11, (sliding_window or 99) - 1),
    )
    # Through safetensors (what SafeCache stores and serves) and back.
    from safetensors.torch import load, save

    again = from_tensors(load(save(tensors)))
    assert to_tensors(again).keys() == tensors.keys()
    for name, tensor in to_tensors(again).items():
        assert tensor.dtype == tensors[name].dtype and torch.equal(tensor, tensors[name]), name
    assert again.get_seq_length() == cache.get_seq_length() == 11
    if sliding_window:
        assert all(isinstance(layer, DynamicSlidingWindowLayer) for layer in again.layers)
    # Continuing from the copy gives the logits of continuing from the original, bit for bit, and
    # leaves the stored tensors as they were.
    before = {k: v.clone() for k, v in tensors.items()}
    nxt = torch.tensor([[5, 6]])
    with torch.inference_mode():
        a = lm(input_ids=nxt, cache=cache, use_cache=True).logits
        b = lm(input_ids=nxt, cache=again, use_cache=True).logits
    assert torch.equal(a, b)
    assert all(torch.equal(before[k], tensors[k]) for k in before)


def test_caches_that_do_not_hold_plain_tensors_are_refused() -> None:
    from transformers import DynamicCache, StaticCache

    lm = _small_lm()
    with pytest.raises(TypeError, match="StaticLayer"):
        to_tensors(StaticCache(config=lm.config, max_cache_len=16))
    with pytest.raises(ValueError, match="no keys"):
        to_tensors(DynamicCache(config=lm.config))
    with pytest.raises(TypeError, match="DynamicCache"):
        to_tensors([(torch.zeros(1), torch.zeros(1))])


def test_prefix_helper_misses_stores_then_hits_and_never_crosses_models_tenants_or_prompts() -> None:
    lm = _small_lm()
    store = SafeCache(CacheSettings())
    prefix = {"input_ids": torch.arange(1, 20).unsqueeze(0)}
    rng = np.random.default_rng(0)
    image = rng.standard_normal(64).astype(np.float32)

    first = reuse_prefix(lm, prefix, image, store, model_id="lm-a", tenant="alice")
    assert not first.hit and first.stored
    again = reuse_prefix(lm, prefix, image, store, model_id="lm-a", tenant="alice")
    assert again.hit and again.similarity == pytest.approx(1.0, abs=1e-6)
    suffix = torch.tensor([[40, 41, 42]])
    (reused_tokens, reused_logits), (fresh_tokens, fresh_logits) = (
        greedy(lm, again.cache, suffix, 5),
        greedy(lm, compute_prefix(lm, prefix), suffix, 5),
    )
    assert reused_tokens == fresh_tokens and torch.equal(reused_logits, fresh_logits)
    # Another model, another tenant, another prompt (other prefix ids): all recompute.
    assert not reuse_prefix(lm, prefix, image, store, model_id="lm-b", tenant="alice", store_on_miss=False).hit
    assert not reuse_prefix(lm, prefix, image, store, model_id="lm-a", tenant="bob", store_on_miss=False).hit
    other_prompt = {"input_ids": torch.arange(2, 21).unsqueeze(0)}
    assert prefix_salt(other_prompt["input_ids"]) != prefix_salt(prefix["input_ids"])
    assert not reuse_prefix(lm, other_prompt, image, store, model_id="lm-a", tenant="alice", store_on_miss=False).hit
    # Below the threshold: recomputed, and the miss says how close the best entry was.
    far = image + 1.2 * np.linalg.norm(image) * rng.standard_normal(64).astype(np.float32) / 8
    cosine = float(far @ image / np.linalg.norm(far) / np.linalg.norm(image))
    assert cosine < CacheSettings().min_similarity
    below = reuse_prefix(lm, prefix, far, store, model_id="lm-a", tenant="alice", store_on_miss=False)
    assert not below.hit
    # An entry whose stored prefix ids differ from the request's (a salt collision) is not used.
    entry = store.lookup("alice", "lm-a", image, salt=prefix_salt(prefix["input_ids"]))
    assert isinstance(entry, Hit) and torch.equal(entry.tensors[PREFIX_IDS], prefix["input_ids"])


def test_exact_hit_through_a_running_cache_server_generates_what_recomputation_does(model, embedder) -> None:
    images = demo_images()
    with Server(SafeCache(CacheSettings())) as running, SafeCacheClient(running.url, "tok-alice") as client:
        cached = VisionLanguageServer(model, client, embedder)
        cold = cached.answer(images["image A"], "what is this?", 6)
        warm = cached.answer(images["image A"], "what is this?", 6)
        other = cached.answer(images["image B"], "what is this?", 6)
        near = cached.answer(images["image A, cropped"], "what is this?", 6)
        stats = client.stats()
    plain = VisionLanguageServer(model, None, embedder, use_cache=False).answer(images["image A"], "what is this?", 6)
    assert (cold.hit, warm.hit, other.hit) == (False, True, False)
    assert warm.similarity == pytest.approx(1.0, abs=1e-5)
    # Bit for bit on CPU: the first step's logits and every generated token.
    assert torch.equal(warm.first_logits, cold.first_logits) and torch.equal(warm.first_logits, plain.first_logits)
    assert warm.tokens == cold.tokens == plain.tokens
    assert not torch.equal(other.first_logits, cold.first_logits)
    # The crop is a near-duplicate: served from image A's entry (an approximation by design).
    assert near.hit and CacheSettings().min_similarity <= near.similarity < 1.0
    assert stats["entries"] == 2  # image A and image B (the crop was a hit, the warm call too)


def test_the_prefix_holds_the_image_tokens_and_the_kv_has_their_length(model, embedder) -> None:
    store = SafeCache(CacheSettings())
    server = VisionLanguageServer(model, store, embedder, tenant="t")
    assert int((server.prefix_ids == IMAGE).sum()) == 256
    server.answer(demo_images()["image A"], "hi", 1)
    (entry,) = store.entries()
    kv = store.tensors_of(entry)
    assert kv["layers.0.keys"].shape[2] == server.prefix_ids.shape[1]
    assert entry.model_id == server.model_id


def test_the_http_endpoint_answers_and_refuses_bad_requests_in_one_line(model, embedder) -> None:
    store = SafeCache(CacheSettings())
    server = VisionLanguageServer(model, store, embedder, tenant="t")
    http = serve(server)
    url = f"http://127.0.0.1:{http.server_address[1]}/v1/generate"
    try:
        image = base64.b64encode(demo_images()["image B"]).decode()
        ok = httpx.post(url, json={"image": image, "prompt": "hello", "max_new_tokens": 3}, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["tokens"]) == 3 and ok.json()["cache_hit"] is False
        for body in (
            {"image": "not base64!"},
            {"prompt": "no image"},
            {"image": base64.b64encode(b"junk").decode()},
            {"image": image, "max_new_tokens": 10_000},
            {"image": image, "prompt": "x" * 100_000},
            [1, 2],
            {"image": image, "max_new_tokens": "many"},
        ):
            bad = httpx.post(url, content=json.dumps(body), timeout=60)
            assert bad.status_code == 400 and "\n" not in bad.json()["error"], body
        assert httpx.post(url, content=b"{", timeout=60).status_code == 400
    finally:
        http.shutdown()
    # The one good request stored its prefix under its image; nothing else was stored.
    assert isinstance(
        store.lookup("t", server.model_id, embedder(demo_images()["image B"]), salt=prefix_salt(server.prefix_ids)), Hit
    )
    assert len(store.entries()) == 1
    assert isinstance(store.lookup("t", "another-model", np.ones(1280, np.float32)), Miss)


def test_a_body_that_never_arrives_is_cut_off(model, embedder, monkeypatch) -> None:
    import socket
    import time

    import examples.vlm_server as vlm

    monkeypatch.setattr(vlm, "BODY_TIMEOUT_S", 1.0)
    http = serve(VisionLanguageServer(model, SafeCache(CacheSettings()), embedder, tenant="t"))
    try:
        with socket.create_connection(("127.0.0.1", http.server_address[1]), timeout=20) as sock:
            sock.sendall(b'POST /v1/generate HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"ima')
            started = time.monotonic()
            answer = sock.recv(4096)
            assert time.monotonic() - started < 10
        assert answer == b"" or answer.startswith(b"HTTP/1.")  # closed, or a one-line refusal
        ok = httpx.post(
            f"http://127.0.0.1:{http.server_address[1]}/v1/generate",
            timeout=60,
            json={"image": base64.b64encode(demo_images()["image B"]).decode(), "max_new_tokens": 1},
        )
        assert ok.status_code == 200  # the server goes on
    finally:
        http.shutdown()


@pytest.mark.slow
@pytest.mark.services  # the example starts a cache server process
def test_the_example_runs_against_a_cache_server_it_starts_and_prints_ttft_with_and_without_a_hit(
    operator_cache,
) -> None:
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-m", "examples.vlm_server", "--image-tokens", "256"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    assert "SEEDED weights" in out and "image_efficientnet_lite0@2 embeddings (trained)" in out
    lines = dict(re.findall(r"^\s+(image [^\n]*?)\s+time to first token\s+[\d.]+ ms\s+(hit|miss)", out, re.M))
    assert lines == {
        "image A": "miss",
        "image A again": "hit",
        "image A, cropped": "hit",
        "image A, JPEG q75": lines.get("image A, JPEG q75"),
        "image B": "miss",
        "image B again": "hit",
    }, out
