"""SafeCache benchmarks: lookup latency, hit and false-hit rates on near-duplicates, HTTP transfer.

1. Latency: LSH candidates + exact verification against a flat FAISS scan of every entry, on the same
   index and queries (half near-duplicates of stored entries at cosine 0.95, above the 0.9 floor, half
   unrelated), at 10k, 100k and 1M entries of dimension 512. End-to-end ``SafeCache.lookup`` at 10k and 100k too.
2. Near-duplicate workload: generated scenes (3-6 shapes in random colours) are stored; queries are
   their near-duplicates (JPEG q75, a 5-pixel crop, a 0.71x down-and-up resize, a colour shift of up
   to 8 levels, +-5% brightness) and scenes never stored. Keys are the default image operator's
   embeddings (the trained EfficientNet-Lite0), at the shipped threshold and as a sweep of the floor.
   Compared in the same run: an exact-hash cache (vLLM prefix caching: bytes must match) and a
   flat-threshold semantic cache (GPTCache's default: nearest neighbour at similarity >= 0.8, no LSH,
   no admission control).
3. A 16 MB KV payload fetched over HTTP from ``mmlake cache serve`` against the same bytes over a raw
   loopback socket.
4. Two tenants: a quiet tenant's hit rate on its own prompts while a noisy tenant stores at full speed,
   with fair shares and without (one LRU-K order for both), on the same cache budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

import numpy as np

DIM = 512
#: Cosine of the latency benchmark's near-duplicate queries to their entry: clear of the floor, so both
#: methods agree on what should hit and the comparison is about speed.
NEAR_COSINE = 0.95


def _near(rng: np.random.Generator, v: np.ndarray, cosine: float) -> np.ndarray:
    o = rng.standard_normal(v.size).astype(np.float32)
    o -= o.dot(v) * v
    o /= np.linalg.norm(o)
    return (cosine * v + np.sqrt(1 - cosine**2) * o).astype(np.float32)


def _percentiles(seconds: list[float]) -> dict[str, float]:
    ms = np.asarray(seconds) * 1000
    return {"p50_ms": round(float(np.percentile(ms, 50)), 4), "p99_ms": round(float(np.percentile(ms, 99)), 4)}


def latency(sizes: tuple[int, ...] = (10_000, 100_000, 1_000_000), queries: int = 400) -> dict[str, Any]:
    import torch

    from mmlake.cache import CacheSettings, SafeCache
    from mmlake.cache.index import VectorIndex
    from mmlake.cache.lsh import HyperplaneLSH

    settings = CacheSettings()
    out: dict[str, Any] = {
        "lsh": {"bits": settings.lsh_bits, "tables": settings.lsh_tables, "probes": settings.lsh_probes},
        "sizes": {},
    }
    rng = np.random.default_rng(0)
    for n in sizes:
        x = rng.standard_normal((n, DIM)).astype(np.float32)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        index = VectorIndex(
            HyperplaneLSH(DIM, settings.lsh_bits, settings.lsh_tables, settings.lsh_seed), settings.lsh_probes
        )
        index.add_batch([str(i) for i in range(n)], x)
        qs = []
        for j in range(queries):
            i = int(rng.integers(n))
            qs.append(_near(rng, x[i], NEAR_COSINE) if j % 2 == 0 else _near(rng, x[i], 0.0))
        # Each method runs over all queries on its own (a flat scan between LSH lookups would evict the
        # caches the LSH path relies on), after a few warm-up queries.
        lsh_t, flat_t, lsh_best, flat_best = [], [], [], []
        for q in qs[:20]:
            index.similarities(q, index.candidates(q))
        for q in qs:
            t = time.perf_counter()
            slots = index.candidates(q)
            sims = index.similarities(q, slots)
            lsh_best.append(
                int(slots[int(np.argmax(sims))]) if len(slots) and sims.max() >= settings.min_similarity else -1
            )
            lsh_t.append(time.perf_counter() - t)
        for q in qs:
            t = time.perf_counter()
            (slot, score), *_ = index.flat_search(q, 1)
            flat_best.append(slot if score >= settings.min_similarity else -1)
            flat_t.append(time.perf_counter() - t)
        agree = sum(a == b for a, b in zip(lsh_best, flat_best))
        entry: dict[str, Any] = {
            "lsh_plus_verification": _percentiles(lsh_t),
            "flat_scan": _percentiles(flat_t),
            "same_answer_as_flat": round(agree / queries, 4),
        }
        entry["p99_speedup_vs_flat"] = round(entry["flat_scan"]["p99_ms"] / entry["lsh_plus_verification"]["p99_ms"], 1)
        if n <= 100_000:
            cache = SafeCache(settings)
            tiny = {"k": torch.zeros(4)}
            for i in range(n):
                cache.put("bench", "m", x[i], tiny)
            e2e = []
            for q in qs:
                t = time.perf_counter()
                cache.lookup("bench", "m", q)
                e2e.append(time.perf_counter() - t)
            entry["safecache_lookup_end_to_end"] = _percentiles(e2e)
        out["sizes"][str(n)] = entry
        del index, x
    out["target"] = "p99 <= 1 ms at 100k entries (LSH + verification)"
    out["meets_target"] = out["sizes"].get("100000", {}).get("lsh_plus_verification", {}).get("p99_ms", 99) <= 1.0
    return out


def near_duplicates(sources: int = 200, novel: int = 200) -> dict[str, Any]:
    """Stored: ``sources`` generated scenes; queries: each scene's five near-duplicates and ``novel``
    scenes never stored; keys: the default image operator's embeddings (the trained EfficientNet-Lite0
    through ONNX Runtime, exactly what the pipeline and the VLM example key by)."""
    import torch

    from mmlake.cache import CacheSettings, Hit, SafeCache
    from mmlake.ingest.synth import AUGMENTATIONS, augment, png_bytes, scene
    from mmlake.preprocessing.operators import load
    from mmlake.preprocessing.registry import load_registry
    from mmlake.preprocessing.runtime import resolve
    from mmlake.preprocessing.settings import PreprocessSettings

    registry = load_registry(PreprocessSettings())
    spec = registry.default_operators()["image"]
    operator = load(spec, registry, resolve("cpu", 2, "all"))
    rng = np.random.default_rng(1)
    stored = [scene(rng) for _ in range(sources)]
    queries = [(i, kind, augment(stored[i], kind, rng)) for i in range(sources) for kind in range(len(AUGMENTATIONS))]
    queries += [(-1, -1, scene(rng)) for _ in range(novel)]
    stored_png = [png_bytes(img) for img in stored]
    query_png = [png_bytes(img) for _, _, img in queries]
    stored_emb = operator.encode(stored_png).embeddings
    query_emb = operator.encode(query_png).embeddings

    def filled(settings: CacheSettings) -> tuple[SafeCache, dict[str, int]]:
        """A cache holding the stored scenes, and entry id -> scene."""
        cache, sources = SafeCache(settings), {}
        for i, e in enumerate(stored_emb):
            put = cache.put("bench", "vlm", e, {"k": torch.full((4,), float(i))})
            if put.admitted and put.id:
                sources[put.id] = i
        return cache, sources

    settings = CacheSettings()
    cache, entry_source = filled(settings)
    exact = {hashlib.sha256(png).hexdigest(): i for i, png in enumerate(stored_png)}
    unit_stored = stored_emb / np.linalg.norm(stored_emb, axis=1, keepdims=True)

    def score(answers: list[int | None]) -> dict[str, Any]:
        near = [(truth, got) for (truth, _, _), got in zip(queries, answers) if truth >= 0]
        hits = sum(got is not None for _, got in near)
        false = sum(got is not None and got != truth for (truth, _, _), got in zip(queries, answers))
        by_kind = {}
        for k, name in enumerate(AUGMENTATIONS):
            mine = [got for (truth, kind, _), got in zip(queries, answers) if kind == k]
            by_kind[name] = round(sum(g is not None for g in mine) / len(mine), 3)
        return {
            "hit_rate": round(hits / len(near), 4),
            "false_hit_rate": round(false / len(queries), 4),
            "hits": hits,
            "false_hits": false,
            "queries": len(queries),
            "hit_rate_by_augmentation": by_kind,
        }

    def answers(cache: SafeCache, sources: dict[str, int], min_similarity: float | None = None) -> list[int | None]:
        out = []
        for q in query_emb:
            got = cache.lookup("bench", "vlm", q, min_similarity=min_similarity)
            out.append(sources.get(got.id) if isinstance(got, Hit) else None)
        return out

    results: dict[str, Any] = {"default_threshold": settings.min_similarity}
    results["safecache"] = score(answers(cache, entry_source))
    results["safecache"]["admitted"] = len(entry_source)
    # The floor itself swept (a server started with MMLAKE_CACHE_MIN_SIMILARITY=t): below the shipped
    # default a separate cache is built at each floor.
    sweep = {}
    for t in (0.8, 0.82, 0.85, 0.88, 0.9, 0.92, 0.95, 0.97):
        if t >= settings.min_similarity:
            sweep[str(t)] = score(answers(cache, entry_source, t))
        else:
            sweep[str(t)] = score(answers(*filled(CacheSettings(min_similarity=t))))
    results["safecache_threshold_sweep"] = sweep
    results["exact_hash_vllm_style"] = score([exact.get(hashlib.sha256(png).hexdigest()) for png in query_png])
    flat = []
    for q in query_emb:
        sims = unit_stored @ (q / np.linalg.norm(q))
        flat.append(int(np.argmax(sims)) if sims.max() >= 0.8 else None)
    results["flat_threshold_gptcache_style"] = score(flat)
    results["encoder"] = f"{spec.ref} (trained: {spec.trained}), ONNX Runtime on CPU"
    results["workload"] = (
        f"{sources} stored scenes x {len(AUGMENTATIONS)} augmentations "
        f"({', '.join(AUGMENTATIONS)}) + {novel} never-stored scenes"
    )
    results["target"] = "hit rate >= 0.68 with false hits <= 0.005"

    def meets(r: dict[str, Any]) -> bool:
        return r["hit_rate"] >= 0.68 and r["false_hit_rate"] <= 0.005

    results["meets_target_at_default_threshold"] = meets(results["safecache"])
    results["thresholds_meeting_target"] = [t for t, r in results["safecache_threshold_sweep"].items() if meets(r)]
    return results


_RAW_SERVER = r"""
import socket, sys
payload = b"\x01" * int(sys.argv[1])
srv = socket.socket(); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("127.0.0.1", 0)); srv.listen(8)
print(srv.getsockname()[1], flush=True)
while True:
    conn, _ = srv.accept()
    conn.recv(16)
    conn.sendall(payload)
    conn.close()
"""


def transfer(megabytes: int = 16, repeats: int = 31) -> dict[str, Any]:
    import torch

    from mmlake.cache import Hit, SafeCacheClient
    from mmlake.ingest.broker import free_port

    size = megabytes * 1024 * 1024
    raw = subprocess.Popen([sys.executable, "-c", _RAW_SERVER, str(size)], stdout=subprocess.PIPE, text=True)
    workdir = tempfile.mkdtemp()
    tokens = os.path.join(workdir, "tokens.json")
    with open(tokens, "w") as handle:
        json.dump({"bench-token": "bench"}, handle)
    port = free_port()
    exe = shutil.which("mmlake", path=os.path.dirname(sys.executable)) or "mmlake"
    server = subprocess.Popen(
        [exe, "cache", "serve", "--port", str(port), "--tokens", tokens],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "MMLAKE_CACHE_CPU_BYTES": str(4 * size), "MMLAKE_CACHE_GPU_BYTES": "0"},
    )
    try:
        raw_port = int(raw.stdout.readline())  # type: ignore[union-attr]

        from mmlake.cache.client import wait_for_server

        wait_for_server(f"http://127.0.0.1:{port}", process=server)
        embedding = np.random.default_rng(0).standard_normal(64).astype(np.float32)
        kv = {"k": torch.ones(size // 8, dtype=torch.float32), "v": torch.ones(size // 8, dtype=torch.float32)}
        http_t, raw_t = [], []
        with SafeCacheClient(f"http://127.0.0.1:{port}", "bench-token") as client:
            client.put("m", embedding, kv)
            for _ in range(repeats):
                t = time.perf_counter()
                hit = client.lookup("m", embedding)
                http_t.append(time.perf_counter() - t)
                assert isinstance(hit, Hit)
                t = time.perf_counter()
                with socket.create_connection(("127.0.0.1", raw_port)) as sock:
                    sock.sendall(b"go")
                    buf = bytearray(size)
                    view, got = memoryview(buf), 0
                    while got < size:
                        n = sock.recv_into(view[got:])
                        if not n:
                            break
                        got += n
                raw_t.append(time.perf_counter() - t)
        http_s, raw_s = float(np.median(http_t)), float(np.median(raw_t))
        return {
            "payload_mb": megabytes,
            "http_lookup_median_s": round(http_s, 4),
            "http_mb_per_s": round(megabytes / http_s, 1),
            "raw_socket_median_s": round(raw_s, 4),
            "raw_mb_per_s": round(megabytes / raw_s, 1),
            "ratio": round(raw_s / http_s, 3),
            "target_ratio": 0.5,
            "meets_target": raw_s / http_s >= 0.5,
        }
    finally:
        server.terminate()
        raw.terminate()
        server.wait(10)
        raw.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


def two_tenants(budget_mb: int = 64, quiet_prompts: int = 200, noisy_stores: int = 600) -> dict[str, Any]:
    """The quiet tenant holds 200 prompts of 128 KiB (25 MiB, within its half of a 64 MiB budget) and looks
    them up; for each of its lookups the noisy tenant stores a new 1 MiB entry and reuses it twice."""
    import torch

    from mmlake.cache import CacheSettings, Hit, SafeCache

    def kv(nbytes: int, seed: int) -> dict[str, Any]:
        return {"kv": torch.full((nbytes // 4,), float(seed), dtype=torch.float32)}

    rng = np.random.default_rng(11)
    quiet = [rng.standard_normal(DIM).astype(np.float32) for _ in range(quiet_prompts)]
    noisy = [rng.standard_normal(DIM).astype(np.float32) for _ in range(noisy_stores)]
    out: dict[str, Any] = {
        "budget_mb": budget_mb,
        "quiet_prompts": quiet_prompts,
        "quiet_kv_kb": 128,
        "noisy_stores": noisy_stores,
        "noisy_kv_mb": 1,
    }
    for fair in (True, False):
        cache = SafeCache(
            CacheSettings(gpu_bytes=0, cpu_bytes=budget_mb << 20, fair_shares=fair), tenants=["quiet", "noisy"]
        )
        for i, e in enumerate(quiet):
            cache.put("quiet", "m", e, kv(128 << 10, i))
        hits = 0
        started = time.perf_counter()
        for i, e in enumerate(noisy):
            cache.put("noisy", "m", e, kv(1 << 20, i))
            cache.lookup("noisy", "m", e)
            cache.lookup("noisy", "m", e)
            hits += isinstance(cache.lookup("quiet", "m", quiet[i % quiet_prompts]), Hit)
        elapsed = time.perf_counter() - started
        out["fair_shares" if fair else "no_shares"] = {
            "quiet_hit_rate": round(hits / noisy_stores, 3),
            "noisy_stores_per_s": round(noisy_stores / elapsed, 1),
            "bytes_within_budget": cache.stats()["bytes"]["cpu"] <= budget_mb << 20,
        }
    out["quiet_hit_rate_ratio_fair_vs_none"] = round(
        out["fair_shares"]["quiet_hit_rate"] / max(out["no_shares"]["quiet_hit_rate"], 1e-3), 1
    )
    return out


def run() -> dict[str, Any]:
    started = time.monotonic()
    report = {
        "latency": latency(),
        "near_duplicates": near_duplicates(),
        "transfer_16mb": transfer(),
        "two_tenants": two_tenants(),
    }
    report["seconds"] = round(time.monotonic() - started, 1)
    report["measured_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    return report


if __name__ == "__main__":
    threading.stack_size(0)
    print(json.dumps(run(), indent=2))
