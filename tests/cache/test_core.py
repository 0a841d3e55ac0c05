"""SafeCache in-process: thresholds, TTL, eviction, tenants, admission, tiers, snapshots."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from mmlake.cache import BadRequestError, CacheError, CacheSettings, Hit, Miss, PayloadTooLargeError, SafeCache
from mmlake.cache.snapshot import load_snapshot, save_snapshot
from tests.cache.helpers import Clock, at_cosine, kv, unit

DIM = 64


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def cache(clock: Clock) -> SafeCache:
    return SafeCache(CacheSettings(), clock=clock)


def test_exact_hit_returns_the_stored_tensors(cache) -> None:
    rng = np.random.default_rng(0)
    e, tensors = unit(rng, DIM), kv(1)
    stored = cache.put("a", "m", e, tensors)
    assert stored.admitted and stored.id
    hit = cache.lookup("a", "m", e)
    assert isinstance(hit, Hit) and hit.id == stored.id and hit.similarity == pytest.approx(1.0, abs=1e-6)
    assert all(torch.equal(hit.tensors[k], tensors[k]) for k in tensors)


@pytest.mark.parametrize(("delta", "hits"), [(-0.001, False), (0.001, True)])
def test_threshold_boundary(cache, delta, hits) -> None:
    cosine = CacheSettings().min_similarity + delta
    rng = np.random.default_rng(1)
    e = unit(rng, DIM)
    cache.put("a", "m", e, kv(1))
    q = at_cosine(e, cosine, rng, cache.lsh_for(DIM))
    got = cache.lookup("a", "m", q)
    assert isinstance(got, Hit) is hits
    if not hits:
        assert isinstance(got, Miss) and got.best_similarity == pytest.approx(cosine, abs=1e-5)
        assert cache.stats("a")["rejected_below_threshold"] == 1


def test_requests_may_only_tighten_the_threshold(clock) -> None:
    cache = SafeCache(CacheSettings(min_similarity=0.82), clock=clock)
    rng = np.random.default_rng(2)
    e = unit(rng, DIM)
    cache.put("a", "m", e, kv(1))
    q = at_cosine(e, 0.9, rng, cache.lsh_for(DIM))
    assert isinstance(cache.lookup("a", "m", q, min_similarity=0.85), Hit)
    assert isinstance(cache.lookup("a", "m", q, min_similarity=0.95), Miss)
    with pytest.raises(BadRequestError, match="server floor"):
        cache.lookup("a", "m", q, min_similarity=0.5)


def test_ttl_default_and_override(cache, clock) -> None:
    rng = np.random.default_rng(3)
    short, default = unit(rng, DIM), unit(rng, DIM)
    cache.put("a", "m", short, kv(1), ttl_s=10)
    cache.put("a", "m", default, kv(2))
    clock.now += 10.001
    assert isinstance(cache.lookup("a", "m", short), Miss)
    assert isinstance(cache.lookup("a", "m", default), Hit)
    clock.now += 110
    assert isinstance(cache.lookup("a", "m", default), Miss)
    assert cache.stats("a")["expirations"] == 2 and cache.stats("a")["entries"] == 0


def test_tenants_and_models_are_isolated(cache) -> None:
    rng = np.random.default_rng(4)
    e = unit(rng, DIM)
    mine = cache.put("alice", "m", e, kv(1))
    assert isinstance(cache.lookup("bob", "m", e), Miss)
    assert isinstance(cache.lookup("alice", "other-model", e), Miss)
    assert not cache.delete("bob", mine.id)
    assert cache.stats("bob")["entries"] == 0 and cache.stats("alice")["entries"] == 1
    theirs = cache.put("bob", "m", e, kv(2))  # the same embedding is a new entry for bob
    assert theirs.id != mine.id and not theirs.refreshed
    assert cache.delete("alice", mine.id) and isinstance(cache.lookup("bob", "m", e), Hit)


def test_near_duplicate_store_refreshes(cache, clock) -> None:
    rng = np.random.default_rng(5)
    e = unit(rng, DIM)
    first = cache.put("a", "m", e, kv(1), ttl_s=10)
    clock.now += 9
    again = cache.put("a", "m", at_cosine(e, 0.999, rng, cache.lsh_for(DIM)), kv(2), ttl_s=10)
    assert again.id == first.id and again.refreshed
    assert cache.stats("a")["entries"] == 1
    clock.now += 9  # past the first TTL, within the refreshed one
    hit = cache.lookup("a", "m", e)
    assert isinstance(hit, Hit) and torch.equal(hit.tensors["k"], kv(2)["k"])


def test_eviction_order_is_lru2_weighted_by_similarity(clock) -> None:
    rng = np.random.default_rng(6)
    size = 4096
    cache = SafeCache(
        CacheSettings(gpu_bytes=0, cpu_bytes=3 * size, similarity_weight_s=100, min_similarity=0.82), clock=clock
    )
    es = [unit(rng, DIM) for _ in range(6)]
    lsh = cache.lsh_for(DIM)
    for i in range(3):  # stored at t = 1, 2, 3
        clock.now += 1
        cache.put("a", "m", es[i], kv(i, size))
    clock.now += 1  # t = 4: entry 0 re-used at similarity 1
    cache.lookup("a", "m", es[0])
    clock.now += 1  # t = 5: entry 1 re-used at similarity 0.83
    cache.lookup("a", "m", at_cosine(es[1], 0.83, rng, lsh))
    # Eviction keys (K-th most recent access - (1 - s) * 100, last access - same):
    #   entry 0: (1, 4); entry 1: (2 - 17, 5 - 17) = (-15, -12); entry 2: (-inf, 3).
    # Entries with fewer than K accesses go first, oldest first; the entry being stored is spared.
    ids: list[str] = [e.id for e in sorted(cache.entries(), key=lambda e: e.accesses[0])]
    evicted = []
    for i in (3, 4, 5):
        clock.now += 1
        before = {e.id for e in cache.entries()}
        ids.append(cache.put("a", "m", es[i], kv(i, size)).id)
        (gone,) = before - {e.id for e in cache.entries()}
        evicted.append(ids.index(gone))
    assert evicted == [2, 3, 4]  # each time the oldest single-access entry that is not the new one
    assert [isinstance(cache.lookup("a", "m", es[i]), Hit) for i in range(6)] == [True, True, False, False, False, True]


def test_similarity_weight_decides_between_equally_recent_entries(clock) -> None:
    rng = np.random.default_rng(7)
    size = 4096
    cache = SafeCache(CacheSettings(gpu_bytes=0, cpu_bytes=2 * size, similarity_weight_s=100), clock=clock)
    a, b = unit(rng, DIM), unit(rng, DIM)
    cache.put("t", "m", a, kv(1, size))
    cache.put("t", "m", b, kv(2, size))
    lsh = cache.lsh_for(DIM)
    cache.lookup("t", "m", at_cosine(a, 0.99, rng, lsh))  # same instant, high similarity
    cache.lookup("t", "m", at_cosine(b, 0.85, rng, lsh))  # same instant, low similarity
    clock.now += 1
    cache.put("t", "m", unit(rng, DIM), kv(3, size))
    assert isinstance(cache.lookup("t", "m", a), Hit)
    assert isinstance(cache.lookup("t", "m", b), Miss)


def test_budget_holds_under_load_and_disk_spill_keeps_entries(tmp_path, clock) -> None:
    rng = np.random.default_rng(8)
    size = 8192
    settings = CacheSettings(gpu_bytes=0, cpu_bytes=5 * size, disk_bytes=10 * size, disk_dir=str(tmp_path / "spill"))
    cache = SafeCache(settings, clock=clock)
    es = []
    for i in range(40):
        clock.now += 1
        es.append(unit(rng, DIM))
        cache.put("a", "m", es[-1], kv(i, size))
        stats = cache.stats("a")
        assert stats["bytes"]["cpu"] <= 5 * size and stats["bytes"]["disk"] <= 10 * size
    assert cache.stats("a")["entries"] == 15
    spilled = [e for e in cache.entries() if e.tier == "disk"]
    assert len(spilled) == 10 and len(list((tmp_path / "spill").glob("*.safetensors"))) == 10
    oldest_kept = next(i for i in range(40) if isinstance(cache.lookup("a", "m", es[i]), Hit))
    hit = cache.lookup("a", "m", es[oldest_kept])
    assert torch.equal(hit.tensors["v"], kv(oldest_kept, size)["v"])


def test_collision_bound_stops_a_confusable_bucket(clock) -> None:
    rng = np.random.default_rng(9)
    cache = SafeCache(CacheSettings(collision_min_pairs=5, collision_bound=0.05, min_similarity=0.82), clock=clock)
    lsh = cache.lsh_for(DIM)
    centre = unit(rng, DIM)
    results = [cache.put("a", "m", at_cosine(centre, 0.93, rng, lsh), kv(i)) for i in range(12)]
    refused = [r for r in results if not r.admitted]
    assert refused and "collision rate" in refused[0].reason
    assert all(r.admitted for r in results[: len(results) - len(refused)])
    assert cache.stats("a")["rejected_admission"] == len(refused)
    # A far-away bucket still admits.
    assert cache.put("a", "m", unit(rng, DIM), kv(99)).admitted


@pytest.mark.parametrize(
    ("embedding", "message"),
    [
        ([float("nan")] * DIM, "NaN"),
        ([0.0] * DIM, "zero norm"),
        ([1.0] * (DIM + 1), "does not match"),
        ([[1.0, 2.0]], "1-D"),
        (["x"] * DIM, "list of numbers"),
    ],
)
def test_bad_embeddings_change_nothing(cache, embedding, message) -> None:
    cache.put("a", "m", unit(np.random.default_rng(10), DIM), kv(1))
    before = cache.stats("a")
    with pytest.raises(BadRequestError, match=message):
        cache.put("a", "m", embedding, kv(2))
    with pytest.raises(BadRequestError, match=message):
        cache.lookup("a", "m", embedding)
    after = cache.stats("a")
    assert after["entries"] == before["entries"] and after["stores"] == before["stores"]


def test_other_bad_stores(cache) -> None:
    e = unit(np.random.default_rng(11), DIM)
    with pytest.raises(BadRequestError, match="model_id"):
        cache.put("a", "", e, kv(1))
    with pytest.raises(BadRequestError, match="no KV tensors"):
        cache.put("a", "m", e, {})
    with pytest.raises(BadRequestError, match="ttl_s"):
        cache.put("a", "m", e, kv(1), ttl_s=-1)
    small = SafeCache(CacheSettings(max_entry_bytes=1000))
    with pytest.raises(PayloadTooLargeError):
        small.put("a", "m", e, kv(1, 4096))
    assert cache.stats()["entries"] == 0


def test_deletes_tombstone_then_rebuild(cache) -> None:
    rng = np.random.default_rng(12)
    es = [unit(rng, DIM) for _ in range(3000)]
    ids = [cache.put("a", "m", e, kv(i, 64)).id for i, e in enumerate(es)]
    for entry_id in ids[:2500]:
        assert cache.delete("a", entry_id)
    assert not cache.delete("a", ids[0])
    assert cache.stats("a")["entries"] == 500
    for i in (0, 1000, 2499):
        assert isinstance(cache.lookup("a", "m", es[i]), Miss)
    for i in (2500, 2750, 2999):
        hit = cache.lookup("a", "m", es[i])
        assert isinstance(hit, Hit) and hit.id == ids[i]


def test_snapshot_restore_keeps_live_entries(tmp_path, clock) -> None:
    rng = np.random.default_rng(13)
    cache = SafeCache(CacheSettings(), clock=clock)
    live, dying = unit(rng, DIM), unit(rng, DIM)
    kept = cache.put("a", "m", live, kv(1), ttl_s=100)
    cache.put("b", "m", dying, kv(2), ttl_s=5)
    assert save_snapshot(cache, tmp_path / "snap") == 2
    clock.now += 6
    restarted = SafeCache(CacheSettings(), clock=clock)
    assert load_snapshot(restarted, tmp_path / "snap") == 1
    hit = restarted.lookup("a", "m", live)
    assert isinstance(hit, Hit) and hit.id == kept.id and torch.equal(hit.tensors["k"], kv(1)["k"])
    assert isinstance(restarted.lookup("b", "m", dying), Miss)
    clock.now += 95
    assert isinstance(restarted.lookup("a", "m", live), Miss)  # the TTL survived the restart
    other = SafeCache(CacheSettings(lsh_seed=1))
    with pytest.raises(CacheError, match="LSH"):
        load_snapshot(other, tmp_path / "snap")


def test_flat_scan_agrees_with_lsh_on_hits(cache) -> None:
    rng = np.random.default_rng(14)
    es = [unit(rng, DIM) for _ in range(200)]
    for i, e in enumerate(es):
        cache.put("a", "m", e, kv(i, 64))
    index = cache._indexes[("a", "m", "")]  # namespace: tenant, model, salt
    for i in (0, 57, 199):
        q = es[i].astype(np.float32)
        (slot, score), *_ = index.flat_search(q, 1)
        hit = cache.lookup("a", "m", q)
        assert isinstance(hit, Hit) and index.entry(slot) == hit.id and score == pytest.approx(hit.similarity, abs=1e-5)


@pytest.mark.gpu
def test_gpu_and_cpu_indexes_give_the_same_answers() -> None:
    import faiss

    if faiss.get_num_gpus() == 0:
        pytest.skip("no GPU visible to FAISS on this machine")
    from mmlake.cache.index import VectorIndex
    from mmlake.cache.lsh import HyperplaneLSH

    rng = np.random.default_rng(15)
    lsh = HyperplaneLSH(DIM)
    gpu = VectorIndex(lsh, 2)
    cpu_flat = faiss.IndexFlatIP(DIM)
    vectors = np.stack([unit(rng, DIM) for _ in range(500)]).astype(np.float32)
    for i, v in enumerate(vectors):
        gpu.add(str(i), v)
    cpu_flat.add(vectors)
    q = vectors[7]
    got = gpu.flat_search(q, 5)
    scores, slots = cpu_flat.search(q.reshape(1, -1), 5)
    assert [s for s, _ in got] == list(slots[0])
    assert np.allclose([d for _, d in got], scores[0], atol=1e-5)
