"""The features table: one row per raw record and operator, and the rows' making.

* Feature rows are pure functions of the raw row and the operator: no wall-clock column, so
  recomputing gives byte-identical rows. When and by which run a row was written is in the Delta
  commit (``mmlake.run`` metadata, the commit timestamp).
* Every commit to the table moves one Delta ``txn`` counter (``mmlake-preprocess/<stream>``) in the
  same commit as its rows (:func:`commit`, built on :func:`mmlake.lake.commit`): a commit planned from
  a snapshot whose counter another writer has since moved is refused, and the run re-plans.
* Rows of an operator ``name@version`` whose recorded SHA-256 differs from the operator's now are a
  sign that its bytes changed without a new version: runs refuse, naming both hashes.

Who writes it: incremental runs (:mod:`.incremental`, the rows that are missing) and backfills
(:mod:`.backfill`, an event-time range recomputed).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmlake.errors import InputError
from mmlake.lake import US_PER_DAY, UTC_US, StreamTables, app_id, scan, txn_version
from mmlake.lake import commit as lake_commit
from mmlake.preprocessing.errors import OperatorIntegrityError
from mmlake.preprocessing.operators import Operator, load
from mmlake.preprocessing.registry import OperatorSpec, Registry, load_registry
from mmlake.preprocessing.runtime import RuntimeOptions, resolve
from mmlake.preprocessing.settings import PreprocessSettings

MODEL_TYPE = pa.struct(
    [("name", pa.string()), ("version", pa.string()), ("sha256", pa.string()), ("provider", pa.string())]
)
#: The raw columns an operator reads.
PAYLOAD_COLUMNS = ["record_id", "sample_id", "modality", "event_time", "payload_sha256", "payload"]


def features_schema(dim: int) -> pa.Schema:
    """The features table's Arrow schema (Delta stores the embedding as array<float>)."""
    return pa.schema(
        [
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
        ]
    )


def commit_app_id(stream: str) -> str:
    """The ``txn`` app id of a stream's features commits."""
    return app_id("preprocess", stream)


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
        untrained = sorted(
            op["modality"]
            for op in self.operators
            if not op["trained"] and op["name"] in {k.split("@")[0] for k in self.by_operator}
        )
        note = (
            (f" ({', '.join(untrained)} encoders UNTRAINED: seeded initialisation, their embeddings carry no meaning)")
            if untrained
            else ""
        )
        return (
            f"{self.stream}: {self.rows} feature rows ({self.errors} with errors) in {self.commits} commits: "
            f"{per}; {self.runtime.get('provider', '?')}, ORT {self.runtime.get('ort_version', '?')}{note}"
        )


class FeatureWriter:
    """Opens a stream's operators and turns raw rows into features rows."""

    def __init__(
        self,
        lake: str,
        stream: str,
        settings: PreprocessSettings | None = None,
        *,
        storage_options: dict[str, str] | None = None,
        registry: Registry | None = None,
        operators: Iterable[str] | None = None,
    ) -> None:
        self.settings = settings or PreprocessSettings()
        self.stream = stream
        self.tables = StreamTables(lake, stream, storage_options or {})
        self.registry = registry or load_registry(self.settings)
        specs = self.registry.default_operators()
        for ref in operators or ():
            spec = self.registry.operator(ref)
            specs[spec.modality] = spec
        self.specs: dict[str, OperatorSpec] = specs
        self.runtime: RuntimeOptions = resolve(
            self.settings.provider, self.settings.threads, self.settings.graph_optimization
        )
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
            out.append(
                {
                    "modality": modality,
                    "name": spec.name,
                    "version": spec.version,
                    "sha256": spec.sha256,
                    "trained": spec.trained,
                    "models": [
                        {
                            "name": m.name,
                            "version": m.version,
                            "sha256": self.registry.expected_sha256(m),
                            "opset": m.opset,
                            "provider": op.providers[i] if op else None,
                        }
                        for i, m in enumerate(spec.models)
                    ],
                }
            )
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
    models = [
        {"name": m.name, "version": m.version, "sha256": op.model_shas[i], "provider": op.providers[i]}
        for i, m in enumerate(spec.models)
    ]
    event_us = rows.column("event_time").cast(UTC_US).cast(pa.int64())
    event_date = pa.array(np.asarray(event_us) // US_PER_DAY, pa.int32()).cast(pa.date32())
    return pa.table(
        {
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
        },
        schema=features_schema(dim),
    )


# -- reading and writing the table ---------------------------------------------------------------


def event_time_filter(lo: Any, hi: Any, *, closed: bool = False) -> Any:
    """The dataset filter ``lo <= event_time < hi`` (``<= hi`` when ``closed``)."""
    import pyarrow.dataset as pads

    upper = pads.field("event_time") <= hi if closed else pads.field("event_time") < hi
    return (pads.field("event_time") >= lo) & upper


def isin(table: pa.Table, column: str, values: Iterable[Any]) -> pa.Table:
    """The rows whose string ``column`` is one of ``values`` (after the scan: see :func:`mmlake.lake.scan`)."""
    return table.filter(pc.is_in(table.column(column), value_set=pa.array(list(values), pa.string())))


def first_per_record(table: pa.Table) -> pa.Table:
    """One row per record id, the first (a re-sent duplicate past the dedup horizon is the same bytes)."""
    if table.num_rows == 0:
        return table
    _, first = np.unique(np.asarray(table.column("record_id").to_pylist(), dtype=object), return_index=True)
    return table.take(pa.array(np.sort(first), pa.int64()))


def open_features(tables: StreamTables, dim: int) -> Any:
    """The stream's features table, created empty (partitioned by ``event_date``) if missing."""
    return tables.ensure("features", features_schema(dim), ["event_date"])


def raw_table(tables: StreamTables) -> Any:
    """The stream's raw table; an :class:`InputError` when it has none."""
    raw = tables.open("raw")
    if raw is None:
        raise InputError(f"stream {tables.stream!r} has no raw table at {tables.uri('raw')} (ingest it first)")
    return raw


def commit(
    dt: Any, data: pa.Table, stream: str, seen: int, metadata: dict[str, str], predicate: str | None = None
) -> None:
    """Append (or, with a predicate, replace) ``data`` and move the stream's counter from ``seen`` to
    seen + 1, in one commit; :class:`~mmlake.errors.CommitRaceLost` when another writer moved it first."""
    app = commit_app_id(stream)
    lake_commit(
        dt,
        data,
        txns={app: seen + 1},
        expect={app: seen},
        metadata=metadata,
        mode="append" if predicate is None else "overwrite",
        predicate=predicate,
        partition_by=["event_date"],
    )


def counter(dt: Any, stream: str) -> int:
    """The stream's commit counter in the features table (-1: never committed)."""
    return txn_version(dt, commit_app_id(stream))


def dim(writer: FeatureWriter) -> int:
    """The embedding dimension a new features table is created with (the first modality's operator's)."""
    return writer.operator(sorted(writer.specs)[0]).dim


def check_hashes(done: pa.Table, specs: dict[str, OperatorSpec]) -> None:
    for spec in specs.values():
        mine = done.filter(
            pc.and_(pc.equal(done.column("op_name"), spec.name), pc.equal(done.column("op_version"), spec.version))
        )
        others = set(pc.unique(mine.column("op_sha256")).to_pylist()) - {spec.sha256}
        if others:
            raise OperatorIntegrityError(
                f"features rows of {spec.ref} were made by operator bytes with SHA-256 {sorted(others)[0][:16]}..., "
                f"this run's {spec.ref} is {spec.sha256[:16]}...: its bytes changed without a new version"
            )


def count(summary: PreprocessSummary, rows: pa.Table) -> None:
    summary.rows += rows.num_rows
    summary.errors += rows.num_rows - pc.sum(pc.is_null(rows.column("error_code"))).as_py() if rows.num_rows else 0
    summary.commits += 1
    for name, version in zip(rows.column("op_name").to_pylist(), rows.column("op_version").to_pylist()):
        key = f"{name}@{version}"
        summary.by_operator[key] = summary.by_operator.get(key, 0) + 1


def valid_rows(tables: StreamTables, modality: str, limit: int) -> tuple[list[str], np.ndarray]:
    """(sample ids, embeddings as a float32 matrix) of the first ``limit`` rows of ``modality`` without an
    error, in event-time order (fewer rows if the table has fewer)."""
    dt = tables.open("features")
    if dt is None:
        raise InputError(f"stream {tables.stream!r} has no features table at {tables.uri('features')}")
    table = scan(dt, ["sample_id", "record_id", "modality", "event_time", "embedding", "error_code"])
    keep = pc.and_(pc.equal(table.column("modality"), modality), pc.is_null(table.column("error_code")))
    table = table.filter(keep).sort_by([("event_time", "ascending"), ("record_id", "ascending")]).slice(0, limit)
    ids = pc.coalesce(table.column("sample_id"), table.column("record_id")).to_pylist()
    return ids, np.asarray(table.column("embedding").to_pylist(), dtype=np.float32)


def runtime_json(writer: FeatureWriter) -> str:
    return json.dumps(writer.runtime.as_dict(), sort_keys=True)
