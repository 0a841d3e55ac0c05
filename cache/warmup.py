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
from mmlake.lake import UTC_US, StreamTables, commit, scan, txn_version

KEYS_SCHEMA = pa.schema([
    ("record_id", pa.string()),
    ("sample_id", pa.string()),
    ("modality", pa.string()),
    ("event_time", UTC_US),
    ("lsh_version", pa.string()),
    ("lsh_keys", pa.list_(pa.int64())),
    ("embedding_sha256", pa.string()),
])

_DRIFT_APP = "mmlake-cache-warmup/{stream}/drift-checked-until-us"


def _keys_table(tables: StreamTables) -> Any:
    """``<lake>/<stream>/cache_keys``, created empty if it is not there yet."""
    return tables.ensure("cache_keys", KEYS_SCHEMA)


def precompute_keys(lake: str, stream: str, settings: CacheSettings | None = None, *,
                    storage_options: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """Append to ``<lake>/<stream>/cache_keys`` the LSH keys of feature rows not keyed yet under the
    current LSH version. Returns (rows keyed, LSH versions used). Rerunning adds nothing."""
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

    # Delta has no fixed-size list type: the column reads back as list<float>. Rows whose length
    # differs from the table's (or is null) get no key, like NaN and zero vectors.
    column = table.column("embedding").combine_chunks()
    lengths = np.asarray(pc.fill_null(pc.list_value_length(column), -1))
    dim = int(np.bincount(lengths[lengths > 0]).argmax()) if np.any(lengths > 0) else 0
    if dim == 0:
        return 0, []
    same = lengths == dim
    embeddings = np.zeros((len(lengths), dim), dtype=np.float32)
    embeddings[same] = np.asarray(column.filter(pa.array(same)).flatten(), dtype=np.float32).reshape(-1, dim)
    with np.errstate(invalid="ignore"):
        norms = np.linalg.norm(embeddings, axis=1)
    usable = same & np.isfinite(norms) & (norms > 0)
    lsh = HyperplaneLSH(dim, bits=settings.lsh_bits, tables=settings.lsh_tables, seed=settings.lsh_seed)
    units = np.zeros_like(embeddings)
    units[usable] = embeddings[usable] / norms[usable, None]
    keys = lsh.keys_batch(units)
    rows = []
    for i, row in enumerate(table.select(["record_id", "sample_id", "modality", "event_time"]).to_pylist()):
        if not usable[i] or (row["record_id"], lsh.version) in done_set:
            continue  # NaN or zero embeddings get no key: they could only ever collide wrongly
        rows.append({**row, "lsh_version": lsh.version, "lsh_keys": [int(k) for k in keys[i]],
                     "embedding_sha256": hashlib.sha256(units[i].tobytes()).hexdigest()})
    if rows:
        write_deltalake(existing, pa.Table.from_pylist(rows, schema=KEYS_SCHEMA), mode="append")
    return len(rows), [lsh.version]


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
    app = _DRIFT_APP.format(stream=stream)
    checked = keys.transaction_version(app)
    if checked is not None and checked >= latest:
        return False
    commit(keys, KEYS_SCHEMA.empty_table(), txns={app: latest}, expect={app: txn_version(keys, app)})
    return True
