"""Warm-up: LSH keys for feature rows, and invalidation of a stream's entries on a drift alarm."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from mmlake.cache import CacheSettings, SafeCache, SafeCacheClient
from mmlake.cache.warmup import new_drift_alarm, precompute_keys
from tests.cache.helpers import kv, unit
from tests.cache.test_server import Server

DIM = 16
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def write_features(lake: str, stream: str, embeddings: np.ndarray, modality: str = "image", first: int = 0) -> None:
    n, dim = embeddings.shape
    table = pa.table(
        {
            "record_id": [f"r{i}" for i in range(first, first + n)],
            "sample_id": [f"s{i}" for i in range(first, first + n)],
            "modality": [modality] * n,
            "event_time": pa.array([T0 + timedelta(seconds=i) for i in range(n)], pa.timestamp("us", tz="UTC")),
            "embedding": pa.FixedSizeListArray.from_arrays(pa.array(embeddings.reshape(-1), pa.float32()), dim),
        }
    )
    write_deltalake(f"{lake}/{stream}/features", table, mode="append")


def write_drift(lake: str, stream: str, window_end: datetime, alarm: bool) -> None:
    table = pa.table(
        {
            "window_end": pa.array([window_end], pa.timestamp("us", tz="UTC")),
            "metric": ["mutual_information"],
            "value": [0.1],
            "threshold": [0.5],
            "alarm": [alarm],
        }
    )
    write_deltalake(f"{lake}/{stream}/drift", table, mode="append")


def expected_keys(unit_vec: np.ndarray, settings: CacheSettings) -> list[int]:
    """The documented construction: seeded normal planes, one bit per plane sign, bit b = plane b."""
    dim = unit_vec.size
    rng = np.random.default_rng([settings.lsh_seed, dim, settings.lsh_bits, settings.lsh_tables])
    planes = rng.standard_normal((settings.lsh_tables * settings.lsh_bits, dim)).astype(np.float32)
    signs = (planes @ unit_vec.astype(np.float32) > 0).reshape(settings.lsh_tables, settings.lsh_bits)
    return [sum(1 << b for b in range(settings.lsh_bits) if row[b]) for row in signs]


def test_keys_for_feature_rows(tmp_path) -> None:
    lake = str(tmp_path)
    rng = np.random.default_rng(0)
    embeddings = np.stack([unit(rng, DIM) * 3 for _ in range(30)]).astype(np.float32)
    embeddings[5] = np.nan
    embeddings[6] = 0
    write_features(lake, "s", embeddings)
    settings = CacheSettings()
    assert precompute_keys(lake, "s", settings)[0] == 28
    rows = {r["record_id"]: r for r in DeltaTable(f"{lake}/s/cache_keys").to_pyarrow_table().to_pylist()}
    assert "r5" not in rows and "r6" not in rows
    unit0 = embeddings[0] / np.linalg.norm(embeddings[0])
    assert rows["r0"]["lsh_keys"] == expected_keys(unit0, settings)
    assert precompute_keys(lake, "s", settings)[0] == 0
    write_features(lake, "s", np.stack([unit(rng, DIM) for _ in range(3)]))  # ids r0..r2 again
    assert precompute_keys(lake, "s", settings)[0] == 0
    assert precompute_keys(lake, "nothing-here", settings) == (0, [])


def test_rows_of_each_width_are_keyed_with_the_lsh_of_their_width(tmp_path) -> None:
    lake = str(tmp_path)
    rng = np.random.default_rng(4)
    narrow = np.stack([unit(rng, DIM) for _ in range(5)]).astype(np.float32)
    wide = np.stack([unit(rng, 40) for _ in range(7)]).astype(np.float32)
    write_features(lake, "s", narrow, "text")
    write_features(lake, "s", wide, "image", first=100)  # a trained image encoder: other width
    settings = CacheSettings()
    keyed, versions = precompute_keys(lake, "s", settings)
    assert (
        keyed == 12
        and len(versions) == 2
        and {":d16:", ":d40:"} == {v[v.index(":d") : v.index(":b") + 1] for v in versions}
    )
    rows = {r["record_id"]: r for r in DeltaTable(f"{lake}/s/cache_keys").to_pyarrow_table().to_pylist()}
    assert rows["r0"]["lsh_keys"] == expected_keys(narrow[0], settings)
    assert rows["r100"]["lsh_keys"] == expected_keys(wide[0], settings)
    assert precompute_keys(lake, "s", settings)[0] == 0


def test_each_drift_alarm_triggers_once(tmp_path) -> None:
    lake = str(tmp_path)
    assert not new_drift_alarm(lake, "s")
    write_drift(lake, "s", T0, alarm=False)
    assert not new_drift_alarm(lake, "s")
    write_drift(lake, "s", T0 + timedelta(minutes=1), alarm=True)
    assert new_drift_alarm(lake, "s")
    assert not new_drift_alarm(lake, "s")
    write_drift(lake, "s", T0 + timedelta(minutes=2), alarm=True)
    assert new_drift_alarm(lake, "s")


@pytest.mark.slow
def test_warmup_flow_invalidates_the_drifting_stream_only(prefect_harness, tmp_path) -> None:
    from mmlake.flows.cache import WarmupResult, cache_warmup
    from mmlake.settings import LakeSettings

    lake = str(tmp_path)
    rng = np.random.default_rng(1)
    write_features(lake, "s", np.stack([unit(rng, DIM) for _ in range(4)]))
    write_drift(lake, "s", T0, alarm=True)
    with Server(SafeCache(CacheSettings())) as running, SafeCacheClient(running.url, "tok-alice") as alice:
        drifting = alice.put("m", unit(rng, DIM), kv(1), source="s")
        steady = alice.put("m", unit(rng, DIM), kv(2), source="other")
        result = cache_warmup(stream="s", lake=LakeSettings(lake=lake), cache_url=running.url, token="tok-alice")
        assert result == WarmupResult(
            keyed=4, lsh_versions=[f"hplsh-v1:d{DIM}:b13:t12:s20260101"], drift_alarm=True, invalidated=1
        )
        ids = {e.id for e in running.cache.entries()}
        assert drifting["id"] not in ids and steady["id"] in ids
        again = cache_warmup(stream="s", lake=LakeSettings(lake=lake), cache_url=running.url, token="tok-alice")
        assert again.drift_alarm is False and again.keyed == 0
