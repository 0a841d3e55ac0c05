"""The SafeCache v1 HTTP API end to end, against a real uvicorn server on loopback."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys

import httpx
import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from mmlake.cache import CacheSettings, Hit, Miss, SafeCache, SafeCacheClient
from mmlake.cache.client import wait_for_server
from mmlake.ingest.broker import free_port
from tests.cache.helpers import TOKENS, Server, at_cosine, body, kv, unit

DIM = 32


@pytest.fixture
def server():
    with Server(SafeCache(CacheSettings(max_body_bytes=1 << 20, gpu_bytes=0, cpu_bytes=64 << 10))) as running:
        yield running


def test_v1_round_trip_with_the_client(server) -> None:
    rng = np.random.default_rng(0)
    e, tensors = unit(rng, DIM), kv(1)
    with SafeCacheClient(server.url, "tok-alice") as alice:
        stored = alice.put("llava", e, tensors, ttl_s=60)
        assert stored["admitted"] and len(stored["id"]) == 32 and stored["lsh_key"]
        hit = alice.lookup("llava", e)
        assert isinstance(hit, Hit) and hit.id == stored["id"] and hit.similarity == pytest.approx(1.0, abs=1e-5)
        assert set(hit.tensors) == {"k", "v"} and torch.equal(hit.tensors["k"], tensors["k"])
        near = at_cosine(e, 0.95, rng, server.cache.lsh_for(DIM))
        assert isinstance(alice.lookup("llava", near), Hit)
        assert isinstance(alice.lookup("llava", near, min_similarity=0.99), Miss)
        stats = alice.stats()
        assert (stats["entries"], stats["hits"], stats["misses"], stats["rejected_below_threshold"]) == (1, 2, 1, 1)
        assert alice.delete(stored["id"]) and not alice.delete(stored["id"])
        assert isinstance(alice.lookup("llava", e), Miss)


def test_raw_http_shapes(server) -> None:
    rng = np.random.default_rng(1)
    e = unit(rng, DIM)
    headers = {"Authorization": "Bearer tok-alice"}
    with httpx.Client(base_url=server.url, headers=headers) as http:
        created = http.post("/v1/kv", content=body(e, kv(1), model_id="m"))
        assert created.status_code == 201 and created.json()["admitted"] is True
        hit = http.post("/v1/kv/lookup", json={"embedding": e.tolist(), "model_id": "m"})
        assert hit.status_code == 200 and hit.headers["X-SafeCache-Id"] == created.json()["id"]
        assert float(hit.headers["X-SafeCache-Similarity"]) == pytest.approx(1.0, abs=1e-5)
        assert "embedding" not in load(hit.content)
        far = http.post("/v1/kv/lookup", json={"embedding": at_cosine(e, 0.5, rng).tolist(), "model_id": "m"})
        assert far.status_code == 404 and "best_similarity" in far.json()
        assert http.delete(f"/v1/kv/{created.json()['id']}").status_code == 204
        assert http.delete(f"/v1/kv/{created.json()['id']}").status_code == 404
        assert http.get("/metrics").status_code == 403  # a tenant's token: operators only
        metrics = http.get("/metrics", headers={"Authorization": "Bearer tok-ops"})
        assert metrics.status_code == 200
        assert (
            'safecache_hits_total{tenant="alice"} 1.0' in metrics.text
            and "safecache_lookup_seconds_bucket" in metrics.text
        )
        assert 'safecache_bytes{tenant="alice",tier="cpu"}' in metrics.text
    assert httpx.get(f"{server.url}/healthz").status_code == 200


@pytest.mark.parametrize("auth", [None, "Bearer nope", "Basic tok-alice", "Bearer"])
def test_unauthenticated_requests_are_refused(server, auth) -> None:
    headers = {"Authorization": auth} if auth else {}
    e = unit(np.random.default_rng(2), DIM)
    with httpx.Client(base_url=server.url, headers=headers) as http:
        for response in (
            http.post("/v1/kv", content=body(e, kv(1), model_id="m")),
            http.post("/v1/kv/lookup", json={"embedding": e.tolist(), "model_id": "m"}),
            http.delete("/v1/kv/abc"),
            http.get("/v1/stats"),
            http.get("/metrics"),
        ):
            assert response.status_code == 401 and response.json()["error"]
    assert server.cache.stats()["entries"] == 0


def test_tenants_never_see_each_other(server) -> None:
    e = unit(np.random.default_rng(3), DIM)
    with SafeCacheClient(server.url, "tok-alice") as alice, SafeCacheClient(server.url, "tok-bob") as bob:
        stored = alice.put("m", e, kv(1))
        assert isinstance(bob.lookup("m", e), Miss)
        assert not bob.delete(stored["id"])
        assert bob.stats()["entries"] == 0 and alice.stats()["entries"] == 1
        assert isinstance(alice.lookup("m", e), Hit)


def _bad_bodies() -> list[tuple[bytes, int, str]]:
    e = unit(np.random.default_rng(4), DIM)
    return [
        (b"not safetensors at all", 400, "safetensors"),
        (b"\xff" * 8 + b"{}", 400, "header length"),
        (save(kv(1)), 400, "embedding"),
        (body(e, kv(1)), 400, "model_id"),
        (body(e[:5], kv(1), model_id="m"), 400, "dimension"),
        (body([float("nan")] * DIM, kv(1), model_id="m"), 400, "NaN"),
        (body([0.0] * DIM, kv(1), model_id="m"), 400, "zero norm"),
        (body(e, {}, model_id="m"), 400, "no KV tensors"),
        (body(e, kv(1), model_id="m", ttl_s="soon"), 400, "ttl_s"),
        (save({"embedding": torch.zeros(2, 2), **kv(1)}, metadata={"model_id": "m"}), 400, "1-D float32"),
        (body(e, kv(1, 2 << 20), model_id="m"), 413, "exceeds"),
    ]


@pytest.mark.parametrize(("payload", "status", "message"), _bad_bodies())
def test_bad_stores_are_4xx_and_change_nothing(server, payload, status, message) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-alice"}) as http:
        http.post("/v1/kv", content=body(unit(np.random.default_rng(5), DIM), kv(9), model_id="m"))
        before = server.cache.stats()
        response = http.post("/v1/kv", content=payload)
        assert response.status_code == status
        error = response.json()["error"]
        assert message in error and "\n" not in error
        after = server.cache.stats()
        assert (after["entries"], after["stores"]) == (before["entries"], before["stores"])


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"model_id": "m"}, "embedding"),
        ({"embedding": [1.0] * DIM}, "model_id"),
        ({"embedding": [1.0] * DIM, "model_id": "m", "min_similarity": 0.5}, "server floor"),
        ({"embedding": [1.0] * DIM, "model_id": "m", "min_similarity": "high"}, "min_similarity"),
        ({"embedding": [True] * DIM, "model_id": "m"}, "embedding"),
    ],
)
def test_bad_lookups_are_400(server, query, message) -> None:
    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-alice"}) as http:
        http.post("/v1/kv", content=body(unit(np.random.default_rng(6), DIM), kv(9), model_id="m"))
        response = http.post("/v1/kv/lookup", json=query)
        assert response.status_code == 400 and message in response.json()["error"]
        assert http.post("/v1/kv/lookup", content=b"{nope").status_code == 400


def test_oversize_stream_without_length_is_refused(server) -> None:
    def chunks():
        for _ in range(40):
            yield b"\0" * (64 << 10)

    with httpx.Client(base_url=server.url, headers={"Authorization": "Bearer tok-alice"}) as http:
        response = http.post("/v1/kv", content=chunks())
        assert response.status_code == 413


def test_budget_holds_under_overload_and_server_keeps_answering(server) -> None:
    rng = np.random.default_rng(7)
    with SafeCacheClient(server.url, "tok-alice") as alice:
        es = [unit(rng, DIM) for _ in range(60)]
        for i, e in enumerate(es):
            assert alice.put("m", e, kv(i, 8192))["admitted"]
            assert server.cache.stats()["bytes"]["cpu"] <= 64 << 10
        stats = alice.stats()
        assert stats["entries"] == 8 and stats["evictions"] == 52
        assert isinstance(alice.lookup("m", es[-1]), Hit)


@pytest.mark.slow
@pytest.mark.services  # `mmlake cache serve` processes
def test_cli_server_restores_its_entries_after_a_restart(tmp_path) -> None:
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({**TOKENS.tenants, **{t: {"operator": True} for t in TOKENS.operators}}))
    exe = shutil.which("mmlake", path=os.path.dirname(sys.executable))
    port = free_port()
    args = [
        exe,
        "cache",
        "serve",
        "--port",
        str(port),
        "--tokens",
        str(tokens),
        "--snapshot-dir",
        str(tmp_path / "snap"),
    ]

    def start() -> subprocess.Popen[str]:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        wait_for_server(f"http://127.0.0.1:{port}", process=proc)
        return proc

    e = unit(np.random.default_rng(8), DIM)
    proc = start()
    try:
        with SafeCacheClient(f"http://127.0.0.1:{port}", "tok-alice") as alice:
            stored = alice.put("m", e, kv(1), ttl_s=600)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert "saved 1 live entries" in out
    proc = start()
    try:
        with SafeCacheClient(f"http://127.0.0.1:{port}", "tok-alice") as alice:
            hit = alice.lookup("m", e)
            assert isinstance(hit, Hit) and hit.id == stored["id"]
            assert torch.equal(hit.tensors["v"], kv(1)["v"])
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)


def test_cli_refuses_a_bad_tokens_file(tmp_path, capsys) -> None:
    from mmlake.flows.cli import main

    bad = tmp_path / "tokens.json"
    bad.write_text('["not", "an", "object"]')
    assert main(["cache", "serve", "--tokens", str(bad), "--port", str(free_port())]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "token -> tenant" in err[0]
