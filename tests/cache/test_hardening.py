"""SafeCache as a shared service, against a real server: no 5xx on hostile input, the schema is the
contract, fair shares between tenants, nothing of one tenant visible to another, salts, bounded
memory, slow and oversized bodies, and restores that one bad file cannot stop."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from mmlake.cache import CacheSettings, Hit, Miss, QuotaExceededError, SafeCache, SafeCacheClient
from mmlake.cache.client import wait_for_server
from mmlake.cache.errors import CacheError
from mmlake.cache.server import Tokens, load_tokens
from mmlake.cache.snapshot import load_snapshot, save_snapshot
from mmlake.ingest.broker import free_port
from tests.cache.helpers import Server, at_cosine, body, kv, unit

DIM = 16
ALICE, BOB, OPS = (
    {"Authorization": "Bearer tok-alice"},
    {"Authorization": "Bearer tok-bob"},
    {"Authorization": "Bearer tok-ops"},
)


@pytest.fixture
def server():
    settings = CacheSettings(
        max_body_bytes=1 << 20, gpu_bytes=0, cpu_bytes=4 << 20, body_timeout_s=1.0, max_inflight_bytes=1536 << 10
    )
    with Server(SafeCache(settings)) as running:
        yield running


def _store(http: httpx.Client, embedding, tensors, headers=ALICE, **metadata) -> httpx.Response:
    return http.post("/v1/kv", content=body(embedding, tensors, model_id="m", **metadata), headers=headers)


# -- the schema ---------------------------------------------------------------------------------


def test_the_schema_describes_every_route_and_the_docs_are_off(server) -> None:
    with httpx.Client(base_url=server.url) as http:
        schema = http.get("/openapi.json")
        assert schema.status_code == 200
        spec = schema.json()
        assert spec["openapi"].startswith("3.")
        paths = spec["paths"]
        assert {
            "/v1/kv",
            "/v1/kv/lookup",
            "/v1/kv/{entry_id}",
            "/v1/kv/invalidate",
            "/v1/stats",
            "/metrics",
            "/healthz",
        } <= set(paths)
        store = paths["/v1/kv"]["post"]
        assert store["requestBody"]["content"]["application/octet-stream"]["schema"]["format"] == "binary"
        assert {"400", "401", "413", "429", "503"} <= set(store["responses"])
        lookup = paths["/v1/kv/lookup"]["post"]
        assert "application/octet-stream" in lookup["responses"]["200"]["content"]
        assert "embedding" in lookup["requestBody"]["content"]["application/json"]["schema"]["properties"]
        assert http.get("/docs").status_code == 404 and http.get("/redoc").status_code == 404


# -- no 5xx, one line ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"model_id": "m", "embedding": [' + "1" * 400 + ", 1.0]}", "NaN or infinite"),
        (
            '{"model_id": "m", "embedding": [1.0, 2.0], "min_similarity": ' + "9" * 300 + "}",
            "min_similarity must be in",
        ),
        ('{"model_id": "m", "embedding": [NaN, 1.0]}', "not a JSON number"),
        ('{"model_id": "m", "embedding": [1e400, 1.0]}', "NaN or infinite"),
        ("[" * 100000 + "]" * 100000, "nested deeper"),
        ('{"model_id": "m", "embedding": [[[[[[[[[[1]]]]]]]]]]}', "nested deeper"),
        ('{"model_id": "m", "embedding": "x"}', "list of numbers"),
        ("\xff", "not JSON"),
    ],
)
def test_hostile_lookup_bodies_get_a_400(server, payload, message) -> None:
    with httpx.Client(base_url=server.url, headers=ALICE) as http:
        for route in ("/v1/kv/lookup", "/v1/kv/invalidate"):
            answer = http.post(
                route, content=payload.encode("utf-8", "surrogateescape") if payload != "\xff" else b"\xff"
            )
            assert answer.status_code == 400, (route, answer.text)
            assert "\n" not in answer.json()["error"]
            if route == "/v1/kv/lookup":
                assert message in answer.json()["error"]


@pytest.mark.parametrize("values", [[1e-30] * 8, [3e38] * 8])
def test_finite_embeddings_whose_float32_norm_breaks_are_stored_and_found(server, values) -> None:
    """Their float32 norm under- or overflows (1e-30 squared is 0 in float32, 3e38 squared is inf), but
    they are finite and non-zero: normalised in float64, they are ordinary directions."""
    with httpx.Client(base_url=server.url, headers=ALICE) as http:
        stored = http.post("/v1/kv", content=body(np.asarray(values, dtype=np.float32), kv(1), model_id="tiny"))
        assert stored.status_code == 201 and stored.json()["admitted"], stored.text
        for query in (values, [1e-320] * 8, [1.0] * 8):  # the same direction at any scale, even denormal
            found = http.post("/v1/kv/lookup", json={"model_id": "tiny", "embedding": query})
            assert found.status_code == 200, found.text
            assert float(found.headers["X-SafeCache-Similarity"]) == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize(
    "dtype", ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "bool", "complex64", "bfloat16", "int8"]
)
def test_every_dtype_that_is_stored_is_served_back_exactly(server, dtype) -> None:
    base = torch.arange(24).reshape(2, 3, 4)
    if dtype == "bool":
        tensor = base % 3 == 0
    elif dtype == "complex64":
        tensor = torch.complex(base.float(), -base.float())
    else:
        tensor = base.to(getattr(torch, dtype))
    e = unit(np.random.default_rng(5), DIM)
    with SafeCacheClient(server.url, "tok-alice") as alice:
        alice.put("dtypes", e, {"kv": tensor})
        hit = alice.lookup("dtypes", e)
    assert isinstance(hit, Hit)
    back = hit.tensors["kv"]
    assert back.dtype == tensor.dtype and back.shape == tensor.shape
    assert bytes(back.contiguous().view(-1).view(torch.uint8).numpy()) == bytes(
        tensor.contiguous().view(-1).view(torch.uint8).numpy()
    )


# -- tenants, operators, salts -------------------------------------------------------------------


def test_the_tokens_file_names_tenants_shares_and_operators(tmp_path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(
        json.dumps(
            {"t1": "team-a", "t2": {"tenant": "team-b", "share": 0.25}, "t3": "team-b", "ops": {"operator": True}}
        )
    )
    tokens = load_tokens(str(path))
    assert tokens.tenants == {"t1": "team-a", "t2": "team-b", "t3": "team-b"}
    assert tokens.operators == frozenset({"ops"}) and tokens.shares == {"team-b": 0.25}
    cache = SafeCache(CacheSettings(gpu_bytes=0), shares=tokens.shares, tenants=tokens.names())
    assert (cache.share_of("team-a"), cache.share_of("team-b")) == (0.75, 0.25)
    for bad, message in (
        (["t"], "must be a non-empty JSON object"),
        ({"t": {"tenant": "a", "share": 1.5}}, "share of 'a' must be in"),
        ({"t": {"tenant": "a", "share": 0.7}, "u": {"tenant": "b", "share": 0.7}}, "add up to 1.4"),
        ({"ops": {"operator": True}}, "names no tenant"),
        ({"t": {"tenant": "a", "admin": True}}, "must be a non-empty JSON object"),
    ):
        path.write_text(json.dumps(bad))
        with pytest.raises(CacheError, match=message):
            load_tokens(str(path))


def test_stats_and_metrics_show_nothing_of_another_tenant(server) -> None:
    with httpx.Client(base_url=server.url) as http:
        assert _store(http, unit(np.random.default_rng(1), 8), kv(1)).status_code == 201
        assert (
            http.post(
                "/v1/kv", content=body(unit(np.random.default_rng(2), 24), kv(2), model_id="b"), headers=BOB
            ).status_code
            == 201
        )
        bob = http.get("/v1/stats", headers=BOB).json()
        assert bob["entries"] == 1 and set(bob["lsh"]) == {"24"} and bob["models"] == 1  # not alice's "8"
        assert bob["bytes"]["cpu"] == 4096 and bob["share"]["cpu"] == (4 << 20) // 2
        assert http.get("/metrics", headers=BOB).status_code == 403
        metrics = http.get("/metrics", headers=OPS)
        assert metrics.status_code == 200
        assert 'safecache_entries{tenant="alice"} 1.0' in metrics.text
        assert 'safecache_entries{tenant="bob"} 1.0' in metrics.text
        assert http.get("/v1/stats", headers=OPS).status_code == 403  # operators hold no entries


def test_a_salt_partitions_a_tenants_entries(server) -> None:
    rng = np.random.default_rng(3)
    e = unit(rng, DIM)
    with SafeCacheClient(server.url, "tok-alice") as alice:
        mine = alice.put("m", e, kv(1), salt="user-1")["id"]
        assert isinstance(alice.lookup("m", e, salt="user-2"), Miss)
        assert isinstance(alice.lookup("m", e), Miss)
        hit = alice.lookup("m", e, salt="user-1")
        assert isinstance(hit, Hit) and hit.id == mine


def test_entries_crafted_to_collide_with_a_victims_never_answer_for_them() -> None:
    """The attacker knows the victim's embeddings and stores exactly them, and vectors crafted into the
    same LSH buckets, under another tenant and, inside the victim's tenant, under another salt: the
    victim's lookups hit only the victim's own entries (only the exact cosine within one namespace
    decides), and the attacker's lookups never reach the victim's."""
    cache = SafeCache(CacheSettings(gpu_bytes=0))
    rng = np.random.default_rng(4)
    lsh = cache.lsh_for(DIM)
    victims = [unit(rng, DIM) for _ in range(20)]
    own = {i: cache.put("victim", "m", e, kv(i), salt="v").id for i, e in enumerate(victims)}
    planted = set()
    for i, e in enumerate(victims):
        planted.add(cache.put("attacker", "m", e, kv(100 + i)).id)  # the very same embedding
        planted.add(cache.put("victim", "m", at_cosine(e, 0.999, rng, lsh), kv(200 + i), salt="attacker").id)
        planted.add(cache.put("attacker", "m", at_cosine(e, 0.9, rng, lsh), kv(300 + i), salt="v").id)
    for i, e in enumerate(victims):
        hit = cache.lookup("victim", "m", e, salt="v")
        assert isinstance(hit, Hit) and hit.id == own[i]
        assert hit.id not in planted
        for tenant, salt in (("attacker", "v"), ("attacker", None), ("victim", "attacker")):
            answer = cache.lookup(tenant, "m", e, salt=salt)
            assert not isinstance(answer, Hit) or answer.id not in own.values()


# -- fair shares and bounded memory -------------------------------------------------------------


def test_a_noisy_tenant_cannot_evict_a_quiet_tenant_within_its_share() -> None:
    mib = 1 << 20
    cache = SafeCache(CacheSettings(gpu_bytes=0, cpu_bytes=8 * mib), tenants=["noisy", "quiet"])
    rng = np.random.default_rng(6)
    quiet = [unit(rng, DIM) for _ in range(24)]
    kept = [cache.put("quiet", "m", e, kv(i, 128 << 10)).id for i, e in enumerate(quiet)]  # 3 MiB of its 4
    for i in range(40):  # 40 x 1 MiB, each reused twice: recency would favour them over the quiet ones
        e = unit(rng, DIM)
        cache.put("noisy", "m", e, kv(1000 + i, mib))
        for _ in range(2):
            assert isinstance(cache.lookup("noisy", "m", e), Hit)
    assert all(entry_id in {e.id for e in cache.entries()} for entry_id in kept)
    assert all(isinstance(cache.lookup("quiet", "m", e), Hit) for e in quiet)
    assert cache.stats()["bytes"]["cpu"] <= 8 * mib  # the global budget holds
    # ... while a share the quiet tenant does not use is free for the noisy one.
    for entry_id in kept:
        cache.delete("quiet", entry_id)
    for i in range(8):
        cache.put("noisy", "m", unit(rng, DIM), kv(2000 + i, mib))
    assert cache.stats("noisy")["bytes"]["cpu"] > 4 * mib


def test_shares_from_the_tokens_file_hold_against_a_running_server() -> None:
    tokens = Tokens({"tok-alice": "alice", "tok-bob": "bob"}, shares={"bob": 0.25})
    settings = CacheSettings(gpu_bytes=0, cpu_bytes=4 << 20, max_body_bytes=2 << 20)
    rng = np.random.default_rng(12)
    with (
        Server(SafeCache(settings), tokens) as running,
        SafeCacheClient(running.url, "tok-alice") as alice,
        SafeCacheClient(running.url, "tok-bob") as bob,
    ):
        quiet = [unit(rng, DIM) for _ in range(7)]
        for i, e in enumerate(quiet):  # 7 x 128 KiB = 896 KiB, within bob's quarter (1 MiB)
            bob.put("m", e, kv(i, 128 << 10))
        for i in range(12):  # 12 x 512 KiB from alice, each reused twice
            e = unit(rng, DIM)
            alice.put("m", e, kv(100 + i, 512 << 10))
            assert isinstance(alice.lookup("m", e), Hit) and isinstance(alice.lookup("m", e), Hit)
        assert all(isinstance(bob.lookup("m", e), Hit) for e in quiet)
        assert bob.stats()["share"]["cpu"] == 1 << 20 and alice.stats()["share"]["cpu"] == 3 << 20
        assert running.cache.stats()["bytes"]["cpu"] <= 4 << 20


def test_the_unfair_order_would_have_evicted_the_quiet_tenant() -> None:
    """The same load with fair shares off: plain LRU-K takes the quiet tenant's entries (the test above
    would fail without shares)."""
    mib = 1 << 20
    cache = SafeCache(CacheSettings(gpu_bytes=0, cpu_bytes=8 * mib, fair_shares=False))
    rng = np.random.default_rng(6)
    kept = [cache.put("quiet", "m", unit(rng, DIM), kv(i, 128 << 10)).id for i in range(24)]
    for i in range(40):
        e = unit(rng, DIM)
        cache.put("noisy", "m", e, kv(1000 + i, mib))
        cache.lookup("noisy", "m", e)
        cache.lookup("noisy", "m", e)
    assert not any(entry_id in {e.id for e in cache.entries()} for entry_id in kept)


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def test_thousands_of_model_ids_stay_within_a_stated_bound() -> None:
    cache = SafeCache(CacheSettings(gpu_bytes=0, max_models_per_tenant=64))
    rng = np.random.default_rng(7)
    tiny = {"kv": torch.zeros(1, dtype=torch.uint8)}
    before = _rss_mb()
    refused = 0
    for i in range(5000):
        try:
            cache.put("t", f"model-{i}", rng.standard_normal(8192).astype(np.float32), tiny)
        except QuotaExceededError:
            refused += 1
    overhead = cache.index_overhead()
    assert refused == 5000 - 64 and overhead["namespaces"] == 64 and overhead["lsh_dims"] == 1
    assert overhead["bytes"] < 16 << 20  # one 8192-d LSH (5 MiB) and 64 one-vector indexes
    assert _rss_mb() - before < 200
    for entry in cache.entries():
        cache.delete("t", entry.id)
    assert cache.index_overhead() == {"namespaces": 0, "lsh_dims": 0, "bytes": 0}  # freed with their entries
    assert cache.put("t", "model-again", rng.standard_normal(8192), tiny).admitted


def test_a_quota_over_http_is_429(server) -> None:
    server.cache.settings = server.cache.settings.model_copy(update={"max_models_per_tenant": 2})
    rng = np.random.default_rng(8)
    with httpx.Client(base_url=server.url, headers=ALICE) as http:
        codes = [
            http.post("/v1/kv", content=body(unit(rng, DIM), kv(i), model_id=f"m{i}")).status_code for i in range(3)
        ]
    assert codes == [201, 201, 429]


# -- bodies: slow, truncated, too many at once ---------------------------------------------------


def _raw_request(port: int, head: bytes, part: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head + part)
    return sock


def test_a_body_that_never_arrives_is_answered_408_within_the_timeout(server) -> None:
    head = (
        b"POST /v1/kv/lookup HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-alice\r\n"
        b"Content-Type: application/json\r\nContent-Length: 10\r\n\r\n"
    )
    started = time.monotonic()
    sock = _raw_request(server.port, head, b'{"a"')
    reply = sock.recv(4096)
    sock.close()
    assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive" in reply
    assert time.monotonic() - started < 5  # the timeout is 1 s here


def test_too_many_bytes_in_flight_is_503_with_retry_after(server) -> None:
    size = 1 << 20  # declared by a slow upload that holds its bytes
    head = (
        f"POST /v1/kv HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok-alice\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    slow = _raw_request(server.port, head, b"x" * 1000)
    try:
        time.sleep(0.2)
        with httpx.Client(base_url=server.url, headers=ALICE) as http:
            busy = http.post(
                "/v1/kv", content=body(unit(np.random.default_rng(9), DIM), kv(1, 600 << 10), model_id="m")
            )
        assert busy.status_code == 503 and busy.headers["Retry-After"] == "1"
        assert "retry" in busy.json()["error"]
    finally:
        slow.close()
    time.sleep(1.5)  # the slow one times out and gives its bytes back
    with httpx.Client(base_url=server.url, headers=ALICE) as http:
        assert _store(http, unit(np.random.default_rng(9), DIM), kv(1, 600 << 10)).status_code == 201


# -- restores that one bad file cannot stop ------------------------------------------------------


def _snapshot(tmp_path: Path, count: int = 6) -> tuple[Path, list[str], list[np.ndarray]]:
    cache = SafeCache(CacheSettings(gpu_bytes=0))
    rng = np.random.default_rng(10)
    embeddings = [unit(rng, DIM) for _ in range(count)]
    ids = [cache.put("alice", "m", e, kv(i)).id for i, e in enumerate(embeddings)]
    folder = tmp_path / "snap"
    assert save_snapshot(cache, folder) == count
    return folder, ids, embeddings


def _truncate(path: Path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


@pytest.mark.parametrize(
    ("corruption", "lost"),
    [
        ("truncated entry", 1),
        ("deleted entry", 1),
        ("garbage entry", 1),
        ("truncated manifest", 0),
        ("string expires_at", 0),
    ],
)
def test_every_intact_entry_comes_back_and_the_bad_file_is_moved_aside(tmp_path, corruption, lost) -> None:
    folder, ids, embeddings = _snapshot(tmp_path)
    bad = folder / f"{ids[2]}.safetensors"
    if corruption == "truncated entry":
        _truncate(bad, 100)
    elif corruption == "deleted entry":
        bad.unlink()
    elif corruption == "garbage entry":
        bad.write_bytes(b"\x00" * 64)
    elif corruption == "truncated manifest":
        _truncate(folder / "manifest.json", 37)
    else:  # one entry's manifest field: the entry file's own copy of its metadata is used instead
        manifest = json.loads((folder / "manifest.json").read_text())
        manifest["entries"][2]["expires_at"] = "tomorrow"
        (folder / "manifest.json").write_text(json.dumps(manifest))
    warnings: list[str] = []
    restored = SafeCache(CacheSettings(gpu_bytes=0))
    assert load_snapshot(restored, folder, warn=warnings.append) == len(ids) - lost
    for i, e in enumerate(embeddings):
        assert isinstance(restored.lookup("alice", "m", e), Hit) == (not lost or i != 2)
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    quarantine = tmp_path / "snap.quarantine"
    if corruption in ("truncated entry", "garbage entry"):
        assert ids[2] in warnings[0] and (quarantine / bad.name).exists() and not bad.exists()
    elif corruption == "deleted entry":
        assert ids[2] in warnings[0] and "missing" in warnings[0]
    elif corruption == "truncated manifest":
        assert "manifest" in warnings[0] and (quarantine / "manifest.json").exists()
    else:
        assert ids[2] in warnings[0] and "expires_at" in warnings[0]


def test_the_server_starts_with_a_damaged_snapshot_and_restores_the_rest(tmp_path) -> None:
    folder, ids, embeddings = _snapshot(tmp_path)
    _truncate(folder / f"{ids[0]}.safetensors", 50)
    (folder / f"{ids[1]}.safetensors").unlink()
    _truncate(folder / "manifest.json", 20)
    tokens = tmp_path / "tokens.json"
    tokens.write_text(json.dumps({"tok-alice": "alice"}))
    port = free_port()
    exe = str(Path(sys.executable).with_name("mmlake"))
    proc = subprocess.Popen(
        [exe, "cache", "serve", "--port", str(port), "--tokens", str(tokens), "--snapshot-dir", str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_server(f"http://127.0.0.1:{port}", process=proc)
        with SafeCacheClient(f"http://127.0.0.1:{port}", "tok-alice") as alice:
            hits = [isinstance(alice.lookup("m", e), Hit) for e in embeddings]
    finally:
        proc.terminate()
        out, err = proc.communicate(timeout=30)
    assert hits == [False, False, True, True, True, True]
    assert "restored 4 live entries" in out
    # The manifest and the truncated file are named (with the manifest gone, the deleted file is unknown).
    warned = [line for line in err.splitlines() if line.startswith("mmlake: warning:")]
    assert len(warned) == 2 and "manifest" in warned[0] and ids[0] in warned[1] and "Traceback" not in err


def test_every_error_status_round_trips_between_server_and_client() -> None:
    from mmlake.cache.errors import HTTP_STATUS, BadRequestError, CacheError, error_for, status_of

    for kind, code in HTTP_STATUS.items():
        assert status_of(kind("x")) == code and error_for(code) is kind
    assert status_of(BadRequestError("x")) == 400 and error_for(400) is BadRequestError
    assert error_for(404) is BadRequestError and error_for(500) is CacheError
