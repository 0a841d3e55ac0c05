"""The features table: one row per raw record and operator, written exactly once.

* **Incremental runs** (``run_preprocess``) compute the rows that are missing: raw records of each
  operator's modality with no features row by that operator (name and version). Rows are committed in
  chunks; each commit also moves a Delta ``txn`` counter (``mmlake-preprocess/<stream>``). A commit
  made from a snapshot whose counter another writer has since moved is refused (by Delta's conflict
  check, or by our own check when delta-rs has already refreshed the snapshot), and the run re-plans.
  A killed run leaves whole commits; the next run computes only what is still missing.
* **Backfills** (``run_backfill``) recompute an event-time range: for each day of the range, one
  predicate overwrite replaces the operator's rows in that day's part of the range. Rows outside the
  range and rows of other operators are not touched. A range whose rows already are exactly what the
  operator would write (same records, same operator hash) is left alone, so a rerun changes nothing.
* Feature rows are pure functions of the raw row and the operator: no wall-clock column, so
  recomputing gives byte-identical rows. When and by which run a row was written is in the Delta
  commit (``mmlake.run`` metadata, the commit timestamp).
* Rows of an operator ``name@version`` whose recorded SHA-256 differs from the operator's now are a
  sign that its bytes changed without a new version: the run refuses, naming both hashes.
"""

from __future__ import annotations

import time
import threading
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.errors import CommitConflictError, InputError
from ingest.reader import to_epoch_us
from ingest.tables import UTC_US, StreamTables
from preprocessing.errors import OperatorIntegrityError
from preprocessing.operators import Operator, load
from preprocessing.registry import OperatorSpec, Registry
from preprocessing.runtime import RuntimeOptions, resolve
from preprocessing.settings import PreprocessSettings

_US_PER_DAY = 86_400_000_000
MODEL_TYPE = pa.struct([("name", pa.string()), ("version", pa.string()), ("sha256", pa.string()),
                        ("provider", pa.string())])


def features_schema(dim: int) -> pa.Schema:
    """The features table's Arrow schema (Delta stores the embedding as array<float>)."""
    return pa.schema([
        ("record_id", pa.string()),
        ("sample_id", pa.string()),
        ("modality", pa.string()),
        ("event_time", UTC_US),
        ("payload_sha256", pa.string()),
        ("embedding", pa.list_(pa.float32(), dim)),
        ("error_code", pa.string()),
        ("error", pa.string()),
        ("op_name", pa.string()),
        ("op_version", pa.string()),
        ("op_sha256", pa.string()),
        ("op_models", pa.list_(MODEL_TYPE)),
        ("ort_version", pa.string()),
        ("execution_provider", pa.string()),
        ("encoder_trained", pa.bool_()),
        ("event_date", pa.date32()),
    ])


def commit_app_id(stream: str) -> str:
    return f"mmlake-preprocess/{stream}"


@dataclass
class PreprocessSummary:
    """What a preprocessing or backfill run wrote."""

    stream: str
    rows: int = 0
    errors: int = 0
    commits: int = 0
    conflicts: int = 0
    skipped_ranges: int = 0
    by_operator: dict[str, int] = field(default_factory=dict)
    operators: list[dict[str, Any]] = field(default_factory=list)
    runtime: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0

    def line(self) -> str:
        per = ", ".join(f"{k} {v}" for k, v in sorted(self.by_operator.items())) or "nothing to do"
        untrained = any(not op["trained"] for op in self.operators if op["name"] in
                        {k.split("@")[0] for k in self.by_operator})
        note = " (encoders UNTRAINED: seeded initialisation, embeddings carry no meaning)" if untrained else ""
        return (f"{self.stream}: {self.rows} feature rows ({self.errors} with errors) in {self.commits} commits: "
                f"{per}; {self.runtime.get('provider', '?')}, ORT {self.runtime.get('ort_version', '?')}{note}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class FeatureWriter:
    """Opens a stream's operators and turns raw rows into features rows."""

    def __init__(self, lake: str, stream: str, settings: PreprocessSettings | None = None, *,
                 storage_options: dict[str, str] | None = None, registry: Registry | None = None,
                 operators: Iterable[str] | None = None) -> None:
        self.settings = settings or PreprocessSettings()
        self.stream = stream
        self.tables = StreamTables(lake, stream, storage_options or {})
        self.registry = registry or load_registry(self.settings)
        specs = self.registry.default_operators()
        for ref in operators or ():
            spec = self.registry.operator(ref)
            specs[spec.modality] = spec
        self.specs: dict[str, OperatorSpec] = specs
        self.runtime: RuntimeOptions = resolve(self.settings.provider, self.settings.threads,
                                               self.settings.graph_optimization)
        self._ops: dict[str, Operator] = {}

    def operator(self, modality: str) -> Operator:
        if modality not in self._ops:
            self._ops[modality] = load(self.specs[modality], self.registry, self.runtime)
        return self._ops[modality]

    def open_all(self) -> None:
        """Open every operator now (verifying every model's bytes) rather than at first use."""
        for modality in self.specs:
            self.operator(modality)

    def describe(self) -> list[dict[str, Any]]:
        """The operators as the lineage facet and the run summary list them."""
        out = []
        for modality, spec in sorted(self.specs.items()):
            op = self._ops.get(modality)
            out.append({"modality": modality, "name": spec.name, "version": spec.version, "sha256": spec.sha256,
                        "trained": spec.trained,
                        "models": [{"name": m.name, "version": m.version, "sha256": self.registry.expected_sha256(m),
                                    "opset": m.opset, "provider": op.providers[i] if op else None}
                                   for i, m in enumerate(spec.models)]})
        return out

    def compute(self, raw: pa.Table) -> pa.Table:
        """Features rows for raw rows (columns record_id, sample_id, modality, event_time,
        payload_sha256, payload), in the input's order; rows of modalities without an operator are dropped."""
        parts = []
        for modality in sorted(self.specs):
            rows = raw.filter(pc.equal(raw.column("modality"), modality))
            if rows.num_rows == 0:
                continue
            op = self.operator(modality)
            encoded = op.encode(rows.column("payload").to_pylist(), self.settings.batch_size)
            parts.append(_rows_table(rows, encoded, op))
        if not parts:
            return features_schema(0).empty_table()
        table = pa.concat_tables(_unify(parts))
        return table.sort_by([("event_time", "ascending"), ("record_id", "ascending")])


def _unify(parts: list[pa.Table]) -> list[pa.Table]:
    """Operators of different dimensions in one commit: store the embedding as a plain list."""
    dims = {p.schema.field("embedding").type.list_size for p in parts}
    if len(dims) == 1:
        return parts
    out = []
    for p in parts:
        i = p.schema.get_field_index("embedding")
        out.append(p.set_column(i, "embedding", p.column("embedding").cast(pa.list_(pa.float32()))))
    return out


def _rows_table(rows: pa.Table, encoded: Any, op: Operator) -> pa.Table:
    n, dim = encoded.embeddings.shape
    spec = op.spec
    ok = np.array([e is None for e in encoded.errors])
    values = pa.array(encoded.embeddings.reshape(-1), type=pa.float32())
    embedding = pa.FixedSizeListArray.from_arrays(values, dim, mask=pa.array(~ok))
    models = [{"name": m.name, "version": m.version, "sha256": op.model_shas[i], "provider": op.providers[i]}
              for i, m in enumerate(spec.models)]
    event_us = rows.column("event_time").cast(UTC_US).cast(pa.int64())
    event_date = pa.array(np.asarray(event_us) // _US_PER_DAY, pa.int32()).cast(pa.date32())
    return pa.table({
        "record_id": rows.column("record_id"),
        "sample_id": rows.column("sample_id"),
        "modality": rows.column("modality"),
        "event_time": rows.column("event_time").cast(UTC_US),
        "payload_sha256": rows.column("payload_sha256"),
        "embedding": embedding,
        "error_code": pa.array([e[0] if e else None for e in encoded.errors], pa.string()),
        "error": pa.array([e[1] if e else None for e in encoded.errors], pa.string()),
        "op_name": pa.array([spec.name] * n, pa.string()),
        "op_version": pa.array([spec.version] * n, pa.string()),
        "op_sha256": pa.array([spec.sha256] * n, pa.string()),
        "op_models": pa.array([models] * n, pa.list_(MODEL_TYPE)),
        "ort_version": pa.array([op.options.ort_version] * n, pa.string()),
        "execution_provider": pa.array([op.execution_provider] * n, pa.string()),
        "encoder_trained": pa.array([spec.trained] * n, pa.bool_()),
        "event_date": event_date,
    }, schema=features_schema(dim))


def load_registry(settings: PreprocessSettings) -> Registry:
    registry = Registry.load(settings.manifest, settings.cache_dir)
    if settings.clip_weights or settings.clip_model != "ViT-S-32":
        registry = registry.with_clip(settings.clip_model, settings.clip_weights)
    return registry


def _read(dt: Any, columns: list[str], filter: Any = None) -> pa.Table:
    """Columns of a Delta table, strings as plain ``string``. Files rewritten by delta-rs (compaction,
    delete, predicate overwrite) may hold ``string_view`` columns, which Arrow will not compare with
    ``string``: string predicates are therefore applied after this, never inside the scan."""
    table = dt.to_pyarrow_dataset().to_table(columns=columns, filter=filter)
    for i, f in enumerate(table.schema):
        if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(pa.string()))
    return table


def _time_range(lo: Any, hi: Any, *, closed: bool = False) -> Any:
    import pyarrow.dataset as pads

    upper = pads.field("event_time") <= hi if closed else pads.field("event_time") < hi
    return (pads.field("event_time") >= lo) & upper


def _isin(table: pa.Table, column: str, values: Iterable[Any]) -> pa.Table:
    return table.filter(pc.is_in(table.column(column), value_set=pa.array(list(values), pa.string())))


# -- shared commit machinery --------------------------------------------------------------------

class _Stale(Exception):
    """Another writer moved the commit counter since our snapshot."""


def _open_features(tables: StreamTables, dim: int) -> Any:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    existing = tables.open("features")
    if existing is not None:
        return existing
    try:
        return DeltaTable.create(tables.uri("features"), features_schema(dim), mode="ignore",
                                 partition_by=["event_date"], storage_options=tables.storage_options or None,
                                 name=f"{tables.stream}.features")
    except DeltaError:
        found = tables.open("features")
        if found is None:
            raise
        return found


def _commit(dt: Any, data: pa.Table, app: str, seen: int, metadata: dict[str, str],
            predicate: str | None = None) -> None:
    """Append (or, with a predicate, replace) ``data`` and move the counter from ``seen`` to seen + 1."""
    from deltalake import CommitProperties, Transaction, write_deltalake

    current = dt.transaction_version(app)
    if (-1 if current is None else int(current)) != seen:
        raise _Stale()
    properties = CommitProperties(app_transactions=[Transaction(app, seen + 1)], custom_metadata=metadata)
    if predicate is None:
        write_deltalake(dt, data, mode="append", partition_by=["event_date"], commit_properties=properties)
    else:
        write_deltalake(dt, data, mode="overwrite", predicate=predicate, partition_by=["event_date"],
                        commit_properties=properties)


def _counter(dt: Any, app: str) -> int:
    value = dt.transaction_version(app)
    return -1 if value is None else int(value)


def _check_hashes(done: pa.Table, specs: dict[str, OperatorSpec]) -> None:
    for spec in specs.values():
        mine = done.filter(pc.and_(pc.equal(done.column("op_name"), spec.name),
                                   pc.equal(done.column("op_version"), spec.version)))
        others = set(pc.unique(mine.column("op_sha256")).to_pylist()) - {spec.sha256}
        if others:
            raise OperatorIntegrityError(
                f"features rows of {spec.ref} were made by operator bytes with SHA-256 {sorted(others)[0][:16]}..., "
                f"this run's {spec.ref} is {spec.sha256[:16]}...: its bytes changed without a new version")


def _raw(tables: StreamTables) -> Any:
    raw = tables.open("raw")
    if raw is None:
        raise InputError(f"stream {tables.stream!r} has no raw table at {tables.uri('raw')} (ingest it first)")
    return raw


# -- incremental --------------------------------------------------------------------------------

def run_preprocess(lake: str, stream: str, settings: PreprocessSettings | None = None, *,
                   storage_options: dict[str, str] | None = None, registry: Registry | None = None,
                   operators: Iterable[str] | None = None, max_rows: int | None = None,
                   run_id: str | None = None, writer: FeatureWriter | None = None,
                   on_commit: Callable[[PreprocessSummary], None] | None = None,
                   stop: threading.Event | None = None) -> PreprocessSummary:
    """Compute the features rows the stream is missing for its operators (see the module docstring)."""
    started = time.monotonic()
    writer = writer or FeatureWriter(lake, stream, settings, storage_options=storage_options,
                                     registry=registry, operators=operators)
    writer.open_all()
    summary = PreprocessSummary(stream, operators=writer.describe(), runtime=writer.runtime.as_dict())
    raw_dt = _raw(writer.tables)
    app = commit_app_id(stream)
    metadata = {"mmlake.stream": stream, "mmlake.job": "preprocess", "mmlake.run": run_id or "",
                "mmlake.runtime": _json(writer.runtime.as_dict())}
    retries = writer.settings.commit_retries
    remaining = max_rows
    while True:
        dt = _open_features(writer.tables, _dim(writer))
        seen = _counter(dt, app)
        pending = _pending(raw_dt, dt, writer.specs)
        if remaining is not None:
            pending = pending.slice(0, remaining)
        try:
            for start in range(0, pending.num_rows, writer.settings.commit_rows):
                if stop is not None and stop.is_set():
                    break
                chunk = pending.slice(start, writer.settings.commit_rows)
                rows = writer.compute(_payloads(raw_dt, chunk))
                _commit(dt, rows, app, seen, {**metadata, "mmlake.rows": str(rows.num_rows)})
                seen += 1
                _count(summary, rows)
                if remaining is not None:
                    remaining -= rows.num_rows
                if on_commit is not None:
                    on_commit(summary)
        except Exception as err:
            if not _is_conflict(err):
                raise
            summary.conflicts += 1
            if summary.conflicts > retries:
                raise CommitConflictError(f"{stream}: lost the features commit race {summary.conflicts} times") from None
            time.sleep(min(0.05 * summary.conflicts, 1.0))
            continue
        break
    summary.seconds = time.monotonic() - started
    return summary


def _dim(writer: FeatureWriter) -> int:
    return writer.operator(sorted(writer.specs)[0]).dim


def _is_conflict(err: Exception) -> bool:
    from deltalake.exceptions import CommitFailedError

    return isinstance(err, (_Stale, CommitFailedError))


def _count(summary: PreprocessSummary, rows: pa.Table) -> None:
    summary.rows += rows.num_rows
    summary.errors += rows.num_rows - pc.sum(pc.is_null(rows.column("error_code"))).as_py() if rows.num_rows else 0
    summary.commits += 1
    for name, version in zip(rows.column("op_name").to_pylist(), rows.column("op_version").to_pylist()):
        key = f"{name}@{version}"
        summary.by_operator[key] = summary.by_operator.get(key, 0) + 1


def _pending(raw_dt: Any, dt: Any, specs: dict[str, OperatorSpec]) -> pa.Table:
    """Raw rows (record_id, modality, event_time) that no features row covers yet, in event-time order."""
    keys = _isin(_read(raw_dt, ["record_id", "modality", "event_time"]), "modality", specs)
    done = _read(dt, ["record_id", "op_name", "op_version", "op_sha256"])
    _check_hashes(done, specs)
    done_ids: set[tuple[str, str]] = set()
    names = {f"{s.name}@{s.version}": m for m, s in specs.items()}
    for rid, name, version in zip(done.column("record_id").to_pylist(), done.column("op_name").to_pylist(),
                                  done.column("op_version").to_pylist()):
        modality = names.get(f"{name}@{version}")
        if modality is not None:
            done_ids.add((rid, modality))
    seen: set[str] = set()
    keep = []
    for i, (rid, modality) in enumerate(zip(keys.column("record_id").to_pylist(), keys.column("modality").to_pylist())):
        if (rid, modality) in done_ids or rid in seen:
            continue
        seen.add(rid)
        keep.append(i)
    return keys.take(pa.array(keep, pa.int64())).sort_by([("event_time", "ascending"), ("record_id", "ascending")])


_PAYLOAD_COLUMNS = ["record_id", "sample_id", "modality", "event_time", "payload_sha256", "payload"]


def _payloads(raw_dt: Any, chunk: pa.Table) -> pa.Table:
    """The raw rows of ``chunk`` with their payloads (files pruned by the chunk's event-time span)."""
    times = chunk.column("event_time")
    table = _read(raw_dt, _PAYLOAD_COLUMNS, _time_range(pc.min(times), pc.max(times), closed=True))
    table = _isin(table, "record_id", chunk.column("record_id").to_pylist())
    # One row per record id (a re-sent duplicate past the dedup horizon is the same bytes).
    _, first = np.unique(np.asarray(table.column("record_id").to_pylist(), dtype=object), return_index=True)
    return table.take(pa.array(np.sort(first), pa.int64()))


def _json(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True)


# -- backfill -----------------------------------------------------------------------------------

def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / 1e6, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def run_backfill(lake: str, stream: str, start: datetime | str | int, end: datetime | str | int,
                 settings: PreprocessSettings | None = None, *, operator: str | None = None, force: bool = False,
                 storage_options: dict[str, str] | None = None, registry: Registry | None = None,
                 run_id: str | None = None,
                 on_progress: Callable[[int, int], None] | None = None) -> PreprocessSummary:
    """Recompute the features of ``start <= event_time < end`` (one predicate overwrite per day of the
    range). With ``operator`` (NAME@VERSION) only that operator's modality, with that operator;
    otherwise every modality with its default operator. ``on_progress(done, total)`` counts raw rows."""
    started = time.monotonic()
    lo, hi = to_epoch_us(start), to_epoch_us(end)
    if lo is None or hi is None or hi <= lo:
        raise InputError(f"a backfill needs --from before --to (got {start} .. {end})")
    writer = FeatureWriter(lake, stream, settings, storage_options=storage_options, registry=registry,
                           operators=[operator] if operator else None)
    if operator:
        spec = writer.registry.operator(operator)
        writer.specs = {spec.modality: spec}
    writer.open_all()
    summary = PreprocessSummary(stream, operators=writer.describe(), runtime=writer.runtime.as_dict())
    raw_dt = _raw(writer.tables)
    app = commit_app_id(stream)
    metadata = {"mmlake.stream": stream, "mmlake.job": "backfill", "mmlake.run": run_id or "",
                "mmlake.range": f"{_iso(lo)}..{_iso(hi)}", "mmlake.runtime": _json(writer.runtime.as_dict())}
    keys = _isin(_read(raw_dt, ["record_id", "modality", "event_time"],
                       _time_range(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US))), "modality", writer.specs)
    total, done = keys.num_rows, 0
    if on_progress:
        on_progress(0, total)
    day = lo - lo % _US_PER_DAY
    while day < hi:
        w_lo, w_hi = max(lo, day), min(hi, day + _US_PER_DAY)
        day += _US_PER_DAY
        for _attempt in range(writer.settings.commit_retries + 1):
            dt = _open_features(writer.tables, _dim(writer))
            seen = _counter(dt, app)
            window = _window(raw_dt, w_lo, w_hi, list(writer.specs))
            if window.num_rows == 0 and not _has_rows(dt, w_lo, w_hi, writer.specs):
                break
            if not force and _up_to_date(dt, window, w_lo, w_hi, writer.specs):
                summary.skipped_ranges += 1
                break
            rows = writer.compute(window)
            try:
                _commit(dt, rows, app, seen, {**metadata, "mmlake.rows": str(rows.num_rows)},
                        predicate=_predicate(w_lo, w_hi, writer.specs))
            except Exception as err:
                if not _is_conflict(err):
                    raise
                summary.conflicts += 1
                continue
            _count(summary, rows)
            break
        else:
            raise CommitConflictError(f"{stream}: lost the features commit race {summary.conflicts} times")
        done += int(pc.sum(pc.and_(pc.greater_equal(keys.column("event_time"), pa.scalar(w_lo, UTC_US)),
                                   pc.less(keys.column("event_time"), pa.scalar(w_hi, UTC_US)))).as_py() or 0)
        if on_progress:
            on_progress(done, total)
    summary.seconds = time.monotonic() - started
    return summary


def _window(raw_dt: Any, lo: int, hi: int, modalities: list[str]) -> pa.Table:
    table = _isin(_read(raw_dt, _PAYLOAD_COLUMNS, _time_range(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US))),
                  "modality", modalities)
    if table.num_rows == 0:
        return table
    _, first = np.unique(np.asarray(table.column("record_id").to_pylist(), dtype=object), return_index=True)
    return table.take(pa.array(np.sort(first), pa.int64()))


def _in_range(dt: Any, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> pa.Table:
    """record_id and op_sha256 of the features rows of ``specs`` in [lo, hi)."""
    rows = _read(dt, ["record_id", "op_name", "op_version", "op_sha256"],
                 _time_range(pa.scalar(lo, UTC_US), pa.scalar(hi, UTC_US)))
    refs = pc.binary_join_element_wise(rows.column("op_name"), rows.column("op_version"), "@")
    mine = pc.is_in(refs, value_set=pa.array([s.ref for s in specs.values()], pa.string()))
    return rows.filter(mine).select(["record_id", "op_sha256"])


def _has_rows(dt: Any, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> bool:
    return _in_range(dt, lo, hi, specs).num_rows > 0


def _up_to_date(dt: Any, window: pa.Table, lo: int, hi: int, specs: dict[str, OperatorSpec]) -> bool:
    """Whether the range already holds exactly one row per raw record, made by these operators' bytes."""
    have = _in_range(dt, lo, hi, specs)
    shas = {s.sha256 for s in specs.values()}
    if set(have.column("op_sha256").to_pylist()) - shas:
        return False
    ids = have.column("record_id").to_pylist()
    return len(ids) == len(set(ids)) and set(ids) == set(window.column("record_id").to_pylist())


def _predicate(lo: int, hi: int, specs: dict[str, OperatorSpec]) -> str:
    ops = " OR ".join(f"(op_name = '{_sql(s.name)}' AND op_version = '{_sql(s.version)}')" for s in specs.values())
    return f"event_time >= '{_iso(lo)}' AND event_time < '{_iso(hi)}' AND ({ops})"


def _sql(text: str) -> str:
    return text.replace("'", "''")
