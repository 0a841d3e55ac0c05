"""Cache tiers are built by name from one registry, in speed order, only where they can exist."""

from __future__ import annotations

import pytest
import torch

from mmlake.cache.tiers import TIERS, DiskTier, MemoryTier, TierConfig, build_tiers, gpu_available


def test_tiers_are_built_by_name_fastest_first(tmp_path) -> None:
    tiers = build_tiers({"disk": TierConfig(1 << 20, str(tmp_path)), "cpu": TierConfig(1 << 10)})
    assert [t.name for t in tiers] == ["cpu", "disk"]
    assert isinstance(tiers[0], MemoryTier) and isinstance(tiers[1], DiskTier)
    assert (tiers[0].budget, tiers[1].budget) == (1 << 10, 1 << 20)
    # A disk tier needs a budget and a folder; a GPU tier a GPU and a budget.
    assert [t.name for t in build_tiers({"cpu": TierConfig(0), "disk": TierConfig(1 << 20)})] == ["cpu"]
    gpu = build_tiers({"gpu": TierConfig(1 << 20)})
    assert [t.name for t in gpu] == (["gpu"] if gpu_available() else [])


def test_an_unknown_tier_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown cache tier.*nvme.*known: cpu, disk, gpu"):
        build_tiers({"nvme": TierConfig(1)})
    assert sorted(TIERS) == ["cpu", "disk", "gpu"]


def test_a_disk_tier_keeps_tensors_across_reads(tmp_path) -> None:
    (disk,) = build_tiers({"disk": TierConfig(1 << 20, str(tmp_path))})
    tensors = {"k": torch.arange(6, dtype=torch.float16).reshape(2, 3)}
    disk.put("e1", tensors)
    assert disk.nbytes == 12 and torch.equal(disk.get("e1")["k"], tensors["k"])
    disk.remove("e1")
    assert disk.nbytes == 0 and not list(tmp_path.iterdir())
