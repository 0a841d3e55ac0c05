"""Snapshot and restore, so a restarted server keeps its live entries.

A snapshot is a folder: ``manifest.json`` (LSH parameters and per-entry metadata) and one safetensors
file per entry holding its KV tensors plus ``__embedding__``. It is written to a temporary folder and
renamed into place, so a crash mid-snapshot leaves the previous one intact.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from mmlake.cache.core import SafeCache
from mmlake.cache.errors import CacheError

_EMBEDDING = "__embedding__"


def _lsh_params(cache: SafeCache) -> dict[str, int]:
    s = cache.settings
    return {"bits": s.lsh_bits, "tables": s.lsh_tables, "seed": s.lsh_seed}


def save_snapshot(cache: SafeCache, folder: str | os.PathLike[str]) -> int:
    """Write every live entry; returns how many."""
    import torch
    from safetensors.torch import save_file

    target = Path(folder)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cache.sweep()
    entries: list[dict[str, object]] = []
    manifest = {"format": 1, "lsh": _lsh_params(cache), "entries": entries}
    for entry in cache.entries():
        tensors = {k: v.detach().cpu().contiguous() for k, v in cache.tensors_of(entry).items()}
        tensors[_EMBEDDING] = torch.from_numpy(cache.embedding_of(entry))
        save_file(tensors, str(tmp / f"{entry.id}.safetensors"))
        entries.append({
            "id": entry.id, "tenant": entry.tenant, "model_id": entry.model_id,
            "expires_at": entry.expires_at, "accesses": entry.accesses,
            "reuse_similarity": entry.reuse_similarity, "source": entry.source,
        })
    (tmp / "manifest.json").write_text(json.dumps(manifest))
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    return len(entries)


def load_snapshot(cache: SafeCache, folder: str | os.PathLike[str]) -> int:
    """Restore the live (unexpired) entries of a snapshot; returns how many. A snapshot made with other
    LSH parameters is refused: its keys would not match."""
    from safetensors.torch import load_file

    source = Path(folder)
    manifest_path = source / "manifest.json"
    if not manifest_path.exists():
        return 0
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("lsh") != _lsh_params(cache):
        raise CacheError(f"snapshot {source} was made with LSH {manifest.get('lsh')}, not {_lsh_params(cache)}")
    restored = 0
    for item in manifest["entries"]:
        tensors = load_file(str(source / f"{item['id']}.safetensors"))
        unit = tensors.pop(_EMBEDDING).numpy()
        restored += cache.restore_entry(
            item["id"], item["tenant"], item["model_id"], unit, tensors,
            expires_at=item["expires_at"], accesses=item["accesses"], reuse_similarity=item["reuse_similarity"],
            source=item.get("source"),
        )
    return restored
