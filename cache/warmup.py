"""Cache warm-up over a stream's features: LSH keys computed ahead, and invalidation on drift.

Contracts it reads (docs/tables.md): ``<lake>/<stream>/features`` (``record_id``, ``sample_id``,
``modality``, ``event_time``, ``embedding`` as fixed_size_list<float32>) and ``<lake>/<stream>/drift``
(one row per window and metric with ``window_end`` and a boolean ``alarm``). Until the preprocessing and
drift stages write those tables, both functions find nothing and say so; nothing else depends on them.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmlake.cache.lsh import HyperplaneLSH
from mmlake.cache.settings import CacheSettings
from mmlake.lake import UTC_US, StreamTables, app_id, commit, scan, txn_version

KEYS_SCHEMA = pa.schema(
    [
        ("record_id", pa.string()),
        ("sample_id", pa.string()),
        ("modality", pa.string()),
        ("event_time", UTC_US),
        ("lsh_version", pa.string()),
        ("lsh_keys", pa.list_(pa.int64())),
        ("embedding_sha256", pa.string()),
    ]
)


def _keys_table(tables: StreamTables) -> Any:
    """``<lake>/<stream>/cache_keys``, created empty if it is not there yet."""
    return tables.ensure("cache_keys", KEYS_SCHEMA)


def precompute_keys(
    lake: str, stream: str, settings: CacheSettings | None = None, *, storage_options: dict[str, str] | None = None
) -> tuple[int, list[str]]:
    """Append to ``<lake>/<stream>/cache_keys`` the LSH keys of feature rows not keyed yet under the
    current LSH version of their width. Returns (rows keyed, LSH versions used: one per embedding
    width). Rerunning adds nothing."""
    from deltalake import write_deltalake

    settings = settings or CacheSettings()
    tables = StreamTables(lake, stream, dict(storage_options or {}))
    features = tables.open("features")
    if features is None:
        return 0, []
    table = scan(features, ["record_id", "sample_id", "modality", "event_time", "embedding"])
    if table.num_rows == 0:
        return 0, []
    existing = _keys_table(tables)
    done = scan(existing, ["record_id", "lsh_version"]).to_pylist()
    done_set = {(r["record_id"], r["lsh_version"]) for r in done}

    # Delta has no fixed-size list type: the column reads back as list<float>. Operators of different
    # widths (the trained image encoder's 1280, the text and audio encoders' 384) are keyed each with the
    # LSH of their own width, as SafeCache keys each dimension; null or empty embeddings get no key, nor
    # do NaN and zero vectors (they could only ever collide wrongly).
    column = table.column("embedding").combine_chunks()
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), 0))
    starts = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.asarray(column.flatten(), dtype=np.float32)
    meta = table.select(["record_id", "sample_id", "modality", "event_time"]).to_pylist()
    rows, versions = [], []
    for dim in sorted({int(n) for n in lengths if n > 0}):
        at = np.flatnonzero(lengths == dim)
        embeddings = np.stack([flat[starts[i] : starts[i + 1]] for i in at])
        with np.errstate(invalid="ignore"):
            norms = np.linalg.norm(embeddings, axis=1)
        usable = np.isfinite(norms) & (norms > 0)
        lsh = HyperplaneLSH(dim, bits=settings.lsh_bits, tables=settings.lsh_tables, seed=settings.lsh_seed)
        units = np.zeros_like(embeddings)
        units[usable] = embeddings[usable] / norms[usable, None]
        keys = lsh.keys_batch(units)
        versions.append(lsh.version)
        for j, i in enumerate(at):
            if not usable[j] or (meta[i]["record_id"], lsh.version) in done_set:
                continue
            rows.append(
                {
                    **meta[i],
                    "lsh_version": lsh.version,
                    "lsh_keys": [int(k) for k in keys[j]],
                    "embedding_sha256": hashlib.sha256(units[j].tobytes()).hexdigest(),
                }
            )
    if rows:
        write_deltalake(existing, pa.Table.from_pylist(rows, schema=KEYS_SCHEMA), mode="append")
    return len(rows), versions


def new_drift_alarm(lake: str, stream: str, *, storage_options: dict[str, str] | None = None) -> bool:
    """Whether the drift table has an alarm in a window that ended after the last check; records the
    check in the ``cache_keys`` log (a txn action, checked against the snapshot it was read from), so
    each alarm triggers one invalidation."""
    tables = StreamTables(lake, stream, dict(storage_options or {}))
    drift = tables.open("drift")
    if drift is None:
        return False
    rows = scan(drift, ["window_end", "alarm"])
    alarms = rows.filter(rows.column("alarm"))
    if alarms.num_rows == 0:
        return False
    latest = max(alarms.column("window_end").cast(UTC_US).cast(pa.int64()).to_pylist())
    keys = _keys_table(tables)
    app = app_id("cache-warmup", stream, "drift-checked-until-us")
    checked = keys.transaction_version(app)
    if checked is not None and checked >= latest:
        return False
    commit(keys, KEYS_SCHEMA.empty_table(), txns={app: latest}, expect={app: txn_version(keys, app)})
    return True
