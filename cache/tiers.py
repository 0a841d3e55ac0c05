"""Where KV tensors live: GPU, CPU and disk tiers behind one small interface, chosen by name."""

from __future__ import annotations

import os
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


def build_tiers(gpu_bytes: int, cpu_bytes: int, disk_bytes: int, disk_dir: str | None) -> list[Tier]:
    """The tiers in order of speed. The GPU tier exists only with a GPU and a budget; the disk tier only
    with a budget and a folder. The CPU tier always exists (a zero budget means: spill or evict at once)."""
    tiers: list[Tier] = []
    if gpu_bytes and gpu_available():
        tiers.append(MemoryTier("gpu", gpu_bytes, "cuda"))
    tiers.append(MemoryTier("cpu", cpu_bytes, "cpu"))
    if disk_bytes and disk_dir:
        tiers.append(DiskTier("disk", disk_bytes, disk_dir))
    return tiers
