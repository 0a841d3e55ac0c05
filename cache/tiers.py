"""Where KV tensors live: GPU, CPU and disk tiers behind one small interface, built by name from a registry."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]


def tensors_nbytes(tensors: Tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


class Tier(Protocol):
    """A store of KV tensor sets with a byte budget."""

    name: str
    budget: int
    nbytes: int

    def put(self, entry_id: str, tensors: Tensors) -> None: ...
    def get(self, entry_id: str) -> Tensors: ...
    def remove(self, entry_id: str) -> None: ...


class MemoryTier:
    """Tensors on a torch device (``cpu`` or ``cuda``)."""

    def __init__(self, name: str, budget: int, device: str) -> None:
        self.name, self.budget, self.device = name, budget, device
        self.nbytes = 0
        self._data: dict[str, Tensors] = {}

    def put(self, entry_id: str, tensors: Tensors) -> None:
        moved = {k: v.to(self.device) for k, v in tensors.items()}
        self.remove(entry_id)
        self._data[entry_id] = moved
        self.nbytes += tensors_nbytes(moved)

    def get(self, entry_id: str) -> Tensors:
        return self._data[entry_id]

    def remove(self, entry_id: str) -> None:
        old = self._data.pop(entry_id, None)
        if old is not None:
            self.nbytes -= tensors_nbytes(old)


class DiskTier:
    """Tensors spilled to one safetensors file per entry."""

    def __init__(self, name: str, budget: int, folder: str) -> None:
        self.name, self.budget = name, budget
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.nbytes = 0
        self._sizes: dict[str, int] = {}

    def _path(self, entry_id: str) -> Path:
        return self.folder / f"{entry_id}.safetensors"

    def put(self, entry_id: str, tensors: Tensors) -> None:
        from safetensors.torch import save_file

        self.remove(entry_id)
        tmp = self._path(entry_id).with_suffix(".tmp")
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(tmp))
        os.replace(tmp, self._path(entry_id))
        self._sizes[entry_id] = tensors_nbytes(tensors)
        self.nbytes += self._sizes[entry_id]

    def get(self, entry_id: str) -> Tensors:
        from safetensors.torch import load_file

        return load_file(str(self._path(entry_id)))

    def remove(self, entry_id: str) -> None:
        size = self._sizes.pop(entry_id, None)
        if size is not None:
            self.nbytes -= size
            self._path(entry_id).unlink(missing_ok=True)


def gpu_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


@dataclass(frozen=True)
class TierConfig:
    """What building a tier may use: its byte budget, and a folder for tiers that keep files."""

    budget: int
    folder: str | None = None


def _gpu(config: TierConfig) -> Tier | None:
    return MemoryTier("gpu", config.budget, "cuda") if config.budget and gpu_available() else None


def _cpu(config: TierConfig) -> Tier | None:
    return MemoryTier("cpu", config.budget, "cpu")  # always there: a zero budget spills or evicts at once


def _disk(config: TierConfig) -> Tier | None:
    return DiskTier("disk", config.budget, config.folder) if config.budget and config.folder else None


#: Tier name -> a builder that returns the tier, or None where it cannot exist here (no GPU, no budget).
TIERS: dict[str, Callable[[TierConfig], Tier | None]] = {"gpu": _gpu, "cpu": _cpu, "disk": _disk}
#: Fastest first: entries are placed in the first tier with room and spill down.
TIER_ORDER = ("gpu", "cpu", "disk")


def build_tiers(configs: Mapping[str, TierConfig], order: Iterable[str] = TIER_ORDER) -> list[Tier]:
    """The tiers of ``order`` that ``configs`` configures and can exist here, built from :data:`TIERS`."""
    unknown = sorted(set(configs) - set(TIERS))
    if unknown:
        raise ValueError(f"unknown cache tier(s) {', '.join(unknown)}; known: {', '.join(sorted(TIERS))}")
    tiers = []
    for name in order:
        if name in configs and (tier := TIERS[name](configs[name])) is not None:
            tiers.append(tier)
    return tiers


def tiers_from_settings(gpu_bytes: int, cpu_bytes: int, disk_bytes: int, disk_dir: str | None) -> list[Tier]:
    """The tiers the settings ask for: a GPU tier only with a GPU and a budget, a disk tier only with a
    budget and a folder, the CPU tier always."""
    return build_tiers(
        {"gpu": TierConfig(gpu_bytes), "cpu": TierConfig(cpu_bytes), "disk": TierConfig(disk_bytes, disk_dir)}
    )
