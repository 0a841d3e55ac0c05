"""Snapshot and restore, so a restarted server keeps its live entries — and one bad file cannot keep it down.

A snapshot is a folder: ``manifest.json`` (the format, the LSH parameters, and each entry's metadata)
and one safetensors file per entry holding its KV tensors, ``__embedding__``, and in its own
``__metadata__`` the same entry metadata and LSH parameters, so that every file can be restored
without the manifest. It is written to a temporary folder and renamed into place, so a crash
mid-snapshot leaves the previous one intact.

On restore every intact entry comes back. A truncated, missing or malformed entry file, an entry whose
metadata does not parse, or a manifest that does not: each is skipped with one warning line naming it,
and the file is moved aside to ``<folder>.quarantine/`` (never deleted). A snapshot made with other LSH
parameters is refused as a whole: its keys would not match.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mmlake.cache.core import SafeCache
from mmlake.cache.errors import CacheError

_EMBEDDING = "__embedding__"
_META = "mmlake.entry"
_LSH = "mmlake.lsh"
FORMAT = 2


def _lsh_params(cache: SafeCache) -> dict[str, int]:
    s = cache.settings
    return {"bits": s.lsh_bits, "tables": s.lsh_tables, "seed": s.lsh_seed}


def _stderr(line: str) -> None:
    print(f"mmlake: warning: {line}", file=sys.stderr, flush=True)


def save_snapshot(cache: SafeCache, folder: str | os.PathLike[str]) -> int:
    """Write every live entry; returns how many."""
    import torch
    from safetensors.torch import save_file

    target = Path(folder)
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cache.sweep()
    lsh = _lsh_params(cache)
    entries: list[dict[str, Any]] = []
    for entry in cache.entries():
        meta = {
            "id": entry.id,
            "tenant": entry.tenant,
            "model_id": entry.model_id,
            "salt": entry.salt,
            "expires_at": entry.expires_at,
            "accesses": entry.accesses,
            "reuse_similarity": entry.reuse_similarity,
            "source": entry.source,
        }
        tensors = {k: v.detach().cpu().contiguous() for k, v in cache.tensors_of(entry).items()}
        tensors[_EMBEDDING] = torch.from_numpy(cache.embedding_of(entry))
        save_file(
            tensors, str(tmp / f"{entry.id}.safetensors"), metadata={_META: json.dumps(meta), _LSH: json.dumps(lsh)}
        )
        entries.append(meta)
    (tmp / "manifest.json").write_text(json.dumps({"format": FORMAT, "lsh": lsh, "entries": entries}))
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        os.replace(target, old)
    os.replace(tmp, target)
    shutil.rmtree(old, ignore_errors=True)
    return len(entries)


def _quarantine(path: Path, source: Path) -> Path:
    """Move a bad file out of the snapshot (which the next save replaces) into a sibling folder."""
    aside = source.with_name(source.name + ".quarantine")
    aside.mkdir(exist_ok=True)
    target = aside / path.name
    if target.exists():
        target = aside / f"{path.stem}.{time.time_ns()}{path.suffix}"
    os.replace(path, target)
    return target


def _entry_meta(raw: Any) -> dict[str, Any]:
    """An entry's metadata, checked field by field; ValueError naming the first bad one."""
    if not isinstance(raw, dict):
        raise ValueError("its metadata is not an object")
    for name in ("id", "tenant", "model_id"):
        if not isinstance(raw.get(name), str) or not raw[name]:
            raise ValueError(f"{name} is missing or not a string")
    for name in ("expires_at", "reuse_similarity"):
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{name} is not a number: {value!r:.40}")
    accesses = raw.get("accesses", [])
    if not isinstance(accesses, list) or not all(
        isinstance(a, int | float) and not isinstance(a, bool) for a in accesses
    ):
        raise ValueError("accesses is not a list of numbers")
    for name in ("source", "salt"):
        if raw.get(name) is not None and not isinstance(raw[name], str):
            raise ValueError(f"{name} is not a string")
    return raw


def _first_valid(listed: Any, own: str | None, path: Path, warn: Callable[[str], None]) -> dict[str, Any]:
    """The entry's metadata from the manifest, or else from its own file (whichever is intact)."""
    problems = []
    for where, raw in (("manifest", listed), ("file", own)):
        if raw is None:
            continue
        try:
            meta = _entry_meta(json.loads(raw) if isinstance(raw, str) else raw)
        except (ValueError, RecursionError) as err:
            problems.append(f"{where}: {err}")
            continue
        if problems:
            warn(
                f"snapshot entry {path}: its manifest metadata is malformed ({problems[0][:100]}); "
                "restored from the metadata in the file itself"
            )
        return meta
    raise ValueError("; ".join(problems) or "no metadata for it")


def load_snapshot(cache: SafeCache, folder: str | os.PathLike[str], *, warn: Callable[[str], None] = _stderr) -> int:
    """Restore the live (unexpired) entries of a snapshot; returns how many. Bad files are skipped with
    a ``warn`` line each and moved aside (see the module docstring); other LSH parameters are refused."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    source = Path(folder)
    if not source.exists():
        return 0
    if not source.is_dir():
        raise CacheError(f"snapshot folder {source} is a file")
    want = _lsh_params(cache)
    listed: dict[str, dict[str, Any]] = {}
    manifest_path = source / "manifest.json"
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
            if not isinstance(manifest, dict) or not isinstance(manifest.get("entries"), list):
                raise ValueError("not a snapshot manifest")
        except (ValueError, UnicodeDecodeError, RecursionError) as err:
            moved = _quarantine(manifest_path, source)
            warn(
                f"snapshot manifest {manifest_path} is unreadable ({str(err).splitlines()[0][:80]}); moved to "
                f"{moved}; restoring from the entry files' own metadata"
            )
            manifest = None
        if manifest is not None:
            if manifest.get("lsh") != want:
                raise CacheError(f"snapshot {source} was made with LSH {manifest.get('lsh')}, not {want}")
            for item in manifest["entries"]:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    listed[item["id"]] = item
                else:
                    warn(f"snapshot manifest {manifest_path}: an entry without an id is skipped")
    files = {p.stem: p for p in source.glob("*.safetensors")}
    for entry_id in sorted(set(listed) - set(files)):
        warn(
            f"snapshot entry {entry_id} is listed in the manifest, but {source / (entry_id + '.safetensors')} "
            "is missing: skipped"
        )
    restored = 0
    for entry_id, path in sorted(files.items()):
        try:
            with safe_open(str(path), framework="pt") as handle:
                own = handle.metadata() or {}
            if json.loads(own.get(_LSH, "null")) not in (None, want):
                raise CacheError(f"snapshot {source} was made with LSH {own.get(_LSH)}, not {want}")
            meta = _first_valid(listed.get(entry_id), own.get(_META), path, warn)
            tensors = load_file(str(path))
            unit = tensors.pop(_EMBEDDING).numpy()
            restored += cache.restore_entry(
                meta["id"],
                meta["tenant"],
                meta["model_id"],
                unit,
                tensors,
                expires_at=float(meta["expires_at"]),
                accesses=[float(a) for a in meta.get("accesses", [])],
                reuse_similarity=float(meta["reuse_similarity"]),
                source=meta.get("source"),
                salt=meta.get("salt"),
            )
        except CacheError as err:
            if "made with LSH" in str(err):
                raise
            moved = _quarantine(path, source)
            warn(f"snapshot entry {path} cannot be restored ({str(err).splitlines()[0][:120]}); moved to {moved}")
        except Exception as err:
            moved = _quarantine(path, source)
            reason = (str(err).splitlines() or [type(err).__name__])[0][:120]
            warn(f"snapshot entry {path} cannot be restored ({type(err).__name__}: {reason}); moved to {moved}")
    return restored
