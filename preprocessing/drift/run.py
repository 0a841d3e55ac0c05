"""Drift runs over a stream's features table: incremental, exactly-once, pinned.

- Input: ``<lake>/<stream>/features``, the rows of each modality's default operator (one embedding per
  part); parts are joined into samples by sample id, a sample's time is its earliest part's event time,
  and samples are taken in (time, sample id) order.
- The codebooks are fitted once, on the stream's first ``reference`` samples (or the samples of an
  event-time range the user chose), and pinned in
  ``<lake>/<stream>/drift_codebook`` (one row per modality: centroids, mean, spread, SHA-256, the operator
  whose embeddings they were fitted on, and the reference statistics). A later run refuses to go on if
  the operator, the settings or the codebook bytes changed (``--rebuild`` starts over).
- Output: ``<lake>/<stream>/drift``, one row per window and metric. Each commit carries the detector's
  state (EWMA statistics, the samples the next window starts with, the cursor) in its commit metadata
  and moves a Delta ``txn`` counter (``mmlake-drift/<stream>``) in the same commit, so a run that dies
  leaves nothing half-done and a rerun continues from the last commit, writing each window once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mmlake.errors import CommitConflictError, CommitRaceLost, InputError
from mmlake.lake import UTC_US, StreamTables, format_us, scan, txn_version
from mmlake.lake import app_id as lake_app_id
from mmlake.lake import commit as lake_commit
from mmlake.preprocessing.drift.codebook import Codebook
from mmlake.preprocessing.drift.detector import (
    ERROR,
    MISSING,
    NAN,
    STATUS_NAMES,
    ZERO_NORM,
    Detector,
    DriftConfig,
    Reference,
    Samples,
)
from mmlake.preprocessing.drift.settings import DriftSettings
from mmlake.preprocessing.drift.state import STATE_KEY, DriftState, latest_state
from mmlake.preprocessing.errors import DriftStateError
from mmlake.preprocessing.registry import OperatorSpec, load_registry
from mmlake.preprocessing.settings import PreprocessSettings

DRIFT_SCHEMA = pa.schema(
    [
        pa.field("window_start", UTC_US, nullable=False),
        pa.field("window_end", UTC_US, nullable=False),
        pa.field("first_sample", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("value", pa.float64()),
        pa.field("threshold", pa.float64()),
        pa.field("threshold_low", pa.float64()),
        pa.field("threshold_high", pa.float64()),
        pa.field("alarm", pa.bool_(), nullable=False),
        pa.field("event", pa.string()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("valid", pa.int32(), nullable=False),
        pa.field("note", pa.string()),
        pa.field("codebook_sha256", pa.string(), nullable=False),
    ]
)

CODEBOOK_SCHEMA = pa.schema(
    [
        pa.field("modality", pa.string(), nullable=False),
        pa.field("codebook_sha256", pa.string(), nullable=False),
        pa.field("codes", pa.int32(), nullable=False),
        pa.field("dim", pa.int32(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("fitted_on", pa.int64(), nullable=False),
        pa.field("mean", pa.list_(pa.float32()), nullable=False),
        pa.field("std", pa.list_(pa.float32()), nullable=False),
        pa.field("whiten", pa.list_(pa.float32()), nullable=False),
        pa.field("centroids", pa.list_(pa.float32()), nullable=False),
        pa.field("op_name", pa.string()),
        pa.field("op_version", pa.string()),
        pa.field("op_sha256", pa.string()),
        pa.field("config_sha256", pa.string(), nullable=False),
        pa.field("reference_from", UTC_US),
        pa.field("reference_to", UTC_US),
        pa.field("reference", pa.string(), nullable=False),  # JSON: the reference statistics
    ]
)


def app_id(stream: str) -> str:
    """The ``txn`` app id of a stream's drift commits."""
    return lake_app_id("drift", stream)


@dataclass
class DriftSummary:
    stream: str
    samples: int = 0  # samples consumed by this run
    windows: int = 0
    rows: int = 0
    alarms_raised: list[dict[str, Any]] = field(default_factory=list)
    alarms_up: list[str] = field(default_factory=list)  # metrics in alarm after the run
    invalid: dict[str, dict[str, int]] = field(default_factory=dict)  # modality -> status -> parts
    skipped_metrics: int = 0
    not_monitored: dict[str, str] = field(default_factory=dict)
    codebook_sha256: str | None = None
    codebooks: dict[str, str] = field(default_factory=dict)
    status: str = ""
    window_rows: list[dict[str, Any]] = field(default_factory=list)  # this run's rows, for the artifact

    def line(self) -> str:
        alarms = f"; ALARM on {', '.join(self.alarms_up)}" if self.alarms_up else "; no alarm"
        return (
            f"drift {self.stream}: {self.samples} samples, {self.windows} windows, {self.rows} rows{alarms}. "
            f"{self.status}"
        )


# -- features -> samples ------------------------------------------------------------------------


def _defaults(settings: PreprocessSettings | None) -> dict[str, OperatorSpec]:
    return load_registry(settings or PreprocessSettings()).default_operators()


def read_samples(features: Any, ops: dict[str, OperatorSpec], since_us: int | None = None) -> Samples:
    """The samples of the default operators' rows with event time >= ``since_us``, in order."""
    import pyarrow.dataset as pads

    flt = None if since_us is None else pads.field("event_time") >= pa.scalar(since_us, UTC_US)
    table = scan(
        features,
        ["record_id", "sample_id", "modality", "event_time", "embedding", "error_code", "op_name", "op_version"],
        flt,
    )
    keep = None
    for modality, spec in ops.items():
        mine = pc.and_(
            pc.equal(table.column("modality"), modality),
            pc.and_(pc.equal(table.column("op_name"), spec.name), pc.equal(table.column("op_version"), spec.version)),
        )
        keep = mine if keep is None else pc.or_(keep, mine)
    if keep is None:
        return Samples.empty([])
    table = table.filter(keep)
    sid = pc.coalesce(table.column("sample_id"), table.column("record_id")).to_pylist()
    times = pc.cast(table.column("event_time"), pa.int64()).to_numpy()
    order: dict[str, int] = {}
    first: list[int] = []
    for s, t in zip(sid, times, strict=True):
        i = order.setdefault(s, len(order))
        if i == len(first):
            first.append(int(t))
        elif t < first[i]:
            first[i] = int(t)
    ids = list(order)
    rank = sorted(range(len(ids)), key=lambda i: (first[i], ids[i]))
    position = np.empty(len(ids), dtype=np.int64)
    position[rank] = np.arange(len(ids))
    n = len(ids)
    modalities = table.column("modality").to_pylist()
    errors = table.column("error_code").to_pylist()
    # Each modality's operator has its own width (a trained image encoder's 1280, CLIP's 384, ...).
    emb_col = table.column("embedding").combine_chunks()
    valid = np.asarray(emb_col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    lengths = np.asarray(pc.fill_null(pc.list_value_length(emb_col), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    flat = np.asarray(emb_col.flatten().to_numpy(zero_copy_only=False), dtype=np.float32)
    modality_array = np.asarray(modalities, dtype=object)
    dims = {m: int(lengths[valid & (modality_array == m)].max(initial=0)) for m in ops}
    embeddings = {m: np.full((n, dims[m]), np.nan, dtype=np.float32) for m in ops}
    status = {m: np.full(n, MISSING, dtype=np.int8) for m in ops}
    for row, (s, m) in enumerate(zip(sid, modalities, strict=True)):
        p = position[order[s]]
        if errors[row] is not None or not valid[row] or lengths[row] != dims[m]:
            status[m][p] = ERROR
            continue
        e = flat[starts[row] : starts[row + 1]]
        embeddings[m][p] = e
        status[m][p] = NAN if not np.isfinite(e).all() else (ZERO_NORM if not np.any(e) else 0)
    return Samples(np.asarray([first[i] for i in rank], dtype=np.int64), [ids[i] for i in rank], embeddings, status)


def _after(samples: Samples, cursor: tuple[int, str] | None) -> int:
    """Index of the first sample strictly after ``cursor``."""
    if cursor is None:
        return 0
    t, sid = cursor
    for i, (ti, si) in enumerate(zip(samples.times.tolist(), samples.ids, strict=True)):
        if (ti, si) > (t, sid):
            return i
    return len(samples)


# -- state --------------------------------------------------------------------------------------


def _codebook_rows(dt: Any) -> list[dict[str, Any]]:
    """The codebook table's rows (one per modality; none without the table), read once per run."""
    return scan(dt).to_pylist() if dt is not None else []


def _load_reference(rows: list[dict[str, Any]]) -> Reference:
    books = {r["modality"]: Codebook.from_row(r) for r in rows}
    return Reference.from_state(json.loads(rows[0]["reference"]), books)


def _write_reference(
    tables: StreamTables,
    ref: Reference,
    ops: dict[str, OperatorSpec],
    config_sha: str,
    span: tuple[int, int],
    chosen: tuple[int, int] | None,
) -> None:
    """The codebooks, one row per modality, with the reference statistics and the reference chosen
    (``range``: the event-time range pinned by the user, or null for the stream's first samples)."""
    from deltalake import write_deltalake

    state = json.dumps({**ref.as_state(), "range": list(chosen) if chosen else None}, sort_keys=True)
    rows = []
    for m, book in sorted(ref.codebooks.items()):
        spec = ops.get(m)
        rows.append(
            {
                **book.to_row(),
                "op_name": spec.name if spec else None,
                "op_version": spec.version if spec else None,
                "op_sha256": spec.sha256 if spec else None,
                "config_sha256": config_sha,
                "reference_from": span[0],
                "reference_to": span[1],
                "reference": state,
            }
        )
    table = _table(rows, CODEBOOK_SCHEMA)
    write_deltalake(
        tables.uri("drift_codebook"),
        table,
        mode="overwrite",
        schema_mode="overwrite",
        storage_options=tables.storage_options or None,
        name=f"{tables.stream}.drift_codebook",
    )


def _table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
    """Rows (timestamps as epoch µs) as a table of ``schema``."""
    arrays = [pa.array([r[f.name] for r in rows], pa.int64() if f.type == UTC_US else f.type) for f in schema]
    return pa.Table.from_arrays(arrays, names=schema.names).cast(schema)


def _commit(tables: StreamTables, rows: pa.Table, state: DriftState, seen: int, overwrite: bool) -> None:
    """The windows' rows and the detector state in one commit, moving the counter from ``seen``."""
    app = app_id(tables.stream)
    dt = tables.open("drift")
    try:
        lake_commit(
            dt if dt is not None else tables.uri("drift"),
            rows,
            txns={app: seen + 1},
            expect={app: seen},
            metadata={STATE_KEY: state.to_json()},
            mode="overwrite" if overwrite else "append",
            storage_options=tables.options,
            name=f"{tables.stream}.drift",
        )
    except CommitRaceLost as err:
        raise CommitConflictError(
            f"another drift run on {tables.stream!r} committed first ({err}); rerun to continue from its state"
        ) from err


# -- the reference --------------------------------------------------------------------------------


def _reference_span(samples: Samples, cfg: DriftConfig, chosen: tuple[int, int] | None) -> tuple[int, int] | str:
    """Indices ``(first, end)`` of the reference among ``samples``: the first ``cfg.reference``, or
    those whose time lies in the chosen range ``[lo, hi)``; or why it is not complete yet."""
    if chosen is None:
        if len(samples) < cfg.reference:
            return f"collecting the reference: {len(samples)} of {cfg.reference} samples; no window scored yet"
        return 0, cfg.reference
    lo, hi = chosen
    first = int(np.searchsorted(samples.times, lo, side="left"))
    end = int(np.searchsorted(samples.times, hi, side="left"))
    if end == len(samples):
        # Features may still arrive inside the range until the stream has passed its end.
        reach = format_us(int(samples.times[-1])) if len(samples) else "nothing yet"
        return (
            f"collecting the reference: {end - first} samples in {format_us(lo)}..{format_us(hi)} so far, "
            f"features reach {reach}; no window scored until one lies past the range"
        )
    held = end - first
    valid = {m: int((s[first:end] == 0).sum()) for m, s in samples.status.items()}
    least, parts = cfg.least_reference, max(4 * cfg.codes, 16)
    if held < least or max(valid.values(), default=0) < parts:
        counts = ", ".join(f"{m} {n}" for m, n in sorted(valid.items())) or "none"
        raise InputError(
            f"the reference range {format_us(lo)}..{format_us(hi)} holds {held} samples (valid parts: "
            f"{counts}); {cfg.codes} codes and {cfg.window}-sample windows need at least {least} "
            f"samples and {parts} valid parts of one modality"
        )
    return first, end


def _pinned_range(rows: list[dict[str, Any]]) -> tuple[int, int] | None:
    """The reference range recorded with the codebooks (None: the stream's first samples)."""
    chosen = json.loads(rows[0]["reference"]).get("range") if rows else None
    return (int(chosen[0]), int(chosen[1])) if chosen else None


def _describe(chosen: tuple[int, int] | None, cfg: DriftConfig) -> str:
    return f"{format_us(chosen[0])}..{format_us(chosen[1])}" if chosen else f"the first {cfg.reference} samples"


def _settled_config(cfg: DriftConfig, pinned: DriftState, settings: DriftSettings) -> tuple[DriftConfig, str]:
    """The configuration to continue a drift table with, and a note. Settings the user set
    (environment or arguments) must match the ones the table was scored with; where only a default
    changed (a new release), the table keeps its own, so a scheduled run never stops on an upgrade."""
    old = DriftConfig(**pinned.config)
    new, was = cfg.model_dump(), old.model_dump()
    changed = [k for k in new if new[k] != was[k]]
    chosen = [k for k in changed if k in settings.model_fields_set]
    if chosen or old.sha256 != pinned.config_sha256:
        raise DriftStateError(
            "drift settings changed since the reference was fitted "
            f"({_config_diff(pinned.config, new)}): rerun with the old "
            "settings, or `mmlake drift --rebuild` to start over with the new ones"
        )
    return old, (
        f"; scored with the settings it was started with (new defaults: {_config_diff(pinned.config, new)}; "
        "`mmlake drift --rebuild` moves it to them)"
    )


@dataclass
class _Start:
    """Where a run's scoring starts: the configuration and reference it scores with, the detector (fresh,
    or with the state of the last commit), the new samples, the index of the first scored sample in the
    stream (``offset``), the samples consumed before, the last sample consumed (or the reference's)."""

    cfg: DriftConfig
    ref: Reference
    detector: Detector
    new: Samples
    offset: int
    consumed_before: int
    reference_end: tuple[int, str]
    status: str


def _fresh(
    tables: StreamTables,
    features: Any,
    ops: dict[str, OperatorSpec],
    op_pins: dict[str, str],
    cfg: DriftConfig,
    chosen: tuple[int, int] | None,
    book_rows: list[dict[str, Any]],
    pinned_range: tuple[int, int] | None,
    rebuild: bool,
) -> _Start | str:
    """A start from the reference: the codebooks of the table when they fit these settings, samples and
    operators, else fitted anew (and written); or why the reference is not complete yet."""
    samples = read_samples(features, ops)
    span = _reference_span(samples, cfg, chosen)
    if isinstance(span, str):
        return span
    first, end = span
    ref = None
    if book_rows and not rebuild:
        ref = _load_reference(book_rows)
        if (
            book_rows[0]["config_sha256"] != cfg.sha256
            or pinned_range != chosen
            or {r["modality"]: r["op_sha256"] for r in book_rows} != {m: op_pins.get(m) for m in ref.codebooks}
        ):
            ref = None  # an earlier reference for other settings, samples or operators: refit
    if ref is None:
        ref = Reference.fit(samples.slice(first, end), cfg)
        _write_reference(tables, ref, ops, cfg.sha256, (int(samples.times[first]), int(samples.times[end - 1])), chosen)
        status = f"reference fitted on samples {first + 1}..{end}" + (f" ({_describe(chosen, cfg)})" if chosen else "")
    else:
        status = "reference loaded"
    reference_end = (int(samples.times[end - 1]), samples.ids[end - 1])
    return _Start(cfg, ref, Detector(cfg, ref), samples.slice(end, len(samples)), end, end, reference_end, status)


def _resumed(
    tables: StreamTables,
    features: Any,
    ops: dict[str, OperatorSpec],
    op_pins: dict[str, str],
    cfg: DriftConfig,
    state: DriftState,
    settings: DriftSettings,
    book_rows: list[dict[str, Any]],
) -> _Start:
    """A start from the last commit's state: its codebooks, its settings (where only defaults moved), the
    samples the next window starts with. :class:`DriftStateError` when the state cannot be continued."""
    if not book_rows:
        raise DriftStateError(
            f"{tables.uri('drift')} has a state but {tables.uri('drift_codebook')} is gone: `mmlake drift --rebuild`"
        )
    ref = _load_reference(book_rows)
    if ref.sha256 != state.codebook_sha256:
        raise DriftStateError(
            f"the drift state was scored with codebook {state.codebook_sha256[:12]}, the "
            f"pinned codebook is {ref.sha256[:12]}: `mmlake drift --rebuild`"
        )
    note = ""
    if state.config_sha256 != cfg.sha256:
        cfg, note = _settled_config(cfg, state, settings)
    changed = sorted(m for m in ref.codebooks if state.operators.get(m) != op_pins.get(m))
    if changed:
        raise DriftStateError(
            f"the default operator of {', '.join(changed)} changed since the codebooks were "
            "fitted (its embeddings are not comparable): `mmlake drift --rebuild`"
        )
    since = state.detector["tail_from_us"]
    cursor = state.cursor
    samples = read_samples(features, ops, since if since is not None else cursor[0])
    tail_ids = state.detector["tail_ids"]
    index = {s: i for i, s in enumerate(samples.ids)}
    missing = [s for s in tail_ids if s not in index]
    if missing:
        raise DriftStateError(
            f"{len(missing)} samples the next window starts with are gone from the features "
            f"table (e.g. {missing[0]}): `mmlake drift --rebuild`"
        )
    tail = _take(samples, [index[s] for s in tail_ids])
    new = samples.slice(_after(samples, cursor), len(samples))
    offset = cfg.reference if state.offset is None else state.offset
    return _Start(
        cfg,
        ref,
        Detector(cfg, ref, state.detector, tail),
        new,
        offset,
        state.consumed,
        cursor,
        "continued from the last drift commit" + note,
    )


# -- the run ------------------------------------------------------------------------------------


def run_drift(
    lake: str,
    stream: str,
    settings: DriftSettings | None = None,
    *,
    storage_options: dict[str, str] | None = None,
    preprocess: PreprocessSettings | None = None,
    ops: dict[str, OperatorSpec] | None = None,
    rebuild: bool = False,
    max_samples: int | None = None,
    keep_settings: bool = False,
    reference_range: tuple[int, int] | None = None,
    reference_first: bool = False,
) -> DriftSummary:
    """Score the windows the stream's new features complete (see the module docstring).
    ``max_samples`` bounds how many new samples one run takes (the rest wait for the next run).
    ``keep_settings`` (with ``rebuild``, as a backfill does): rescore with the settings the table was
    scored with, whatever ``settings`` says. ``reference_range`` (epoch µs, ``[lo, hi)``) pins
    the reference to the samples of an event-time range instead of the stream's first
    ``settings.reference``; ``reference_first`` goes back to those. Without either, a rebuild keeps
    the reference the codebooks were fitted on."""

    if reference_range is not None and reference_first:
        raise InputError("choose a reference range or the stream's first samples, not both")
    if reference_range is not None and reference_range[0] >= reference_range[1]:
        raise InputError(
            f"the reference range {format_us(reference_range[0])}..{format_us(reference_range[1])} is empty"
        )
    settings = settings or DriftSettings()
    cfg = DriftConfig.of(settings)
    tables = StreamTables(lake, stream, dict(storage_options or {}))
    drift_dt = tables.open("drift")
    pinned = latest_state(drift_dt)  # the state of the last drift commit, read once
    if keep_settings and pinned is not None and pinned.config:
        cfg = DriftConfig(**pinned.config)
    summary = DriftSummary(stream)
    features = tables.open("features")
    if features is None:
        raise InputError(
            f"stream {stream!r} has no features table at {tables.uri('features')} (run `mmlake preprocess` first)"
        )
    ops = ops if ops is not None else _defaults(preprocess)
    op_pins = {m: s.sha256 for m, s in ops.items()}
    # A default operator that changed since the codebooks were fitted (an upgrade brought a new encoder):
    # its embeddings are not comparable with the reference's, so the stream is rescored from a reference
    # refitted on the new operator's rows, as `--rebuild` would; a scheduled run never stops on it.
    moved = (
        [] if rebuild or pinned is None else sorted(m for m, sha in pinned.operators.items() if op_pins.get(m) != sha)
    )
    rebuild = rebuild or bool(moved)
    counter = txn_version(drift_dt, app_id(stream))
    state = None if rebuild else pinned
    book_rows = _codebook_rows(tables.open("drift_codebook"))
    pinned_range = _pinned_range(book_rows)
    chosen = reference_range if reference_range is not None else (None if reference_first else pinned_range)
    if state is not None and chosen != pinned_range:
        raise DriftStateError(
            f"the reference of {stream!r} is pinned to {_describe(pinned_range, cfg)}: "
            f"`mmlake drift --rebuild` to move it to {_describe(chosen, cfg)}"
        )

    if state is None:
        start = _fresh(tables, features, ops, op_pins, cfg, chosen, book_rows, pinned_range, rebuild)
        if isinstance(start, str):
            summary.status = start
            return summary
    else:
        start = _resumed(tables, features, ops, op_pins, cfg, state, settings, book_rows)
    cfg, ref, detector, new, offset = start.cfg, start.ref, start.detector, start.new, start.offset
    summary.status = start.status

    if max_samples is not None:
        new = new.slice(0, max_samples)
    summary.codebook_sha256 = ref.sha256
    summary.codebooks = {m: b.sha256 for m, b in ref.codebooks.items()}
    summary.not_monitored = dict(ref.skipped)
    for m in ref.codebooks:
        st = new.status.get(m)
        if st is not None:
            summary.invalid[m] = {STATUS_NAMES[v]: int((st == v).sum()) for v in (MISSING, NAN, ZERO_NORM, ERROR)}
    if moved:
        summary.status = (
            f"the default operator of {', '.join(moved)} changed since the codebooks were fitted: "
            f"rescored from a new reference; {summary.status}"
        )
    rows = detector.feed(new) if len(new) else []
    summary.samples = len(new)
    if not len(new) and not rebuild:
        summary.status += "; nothing new"
        return summary
    last = (int(new.times[-1]), new.ids[-1]) if len(new) else start.reference_end
    new_state = DriftState(
        codebook_sha256=ref.sha256,
        config_sha256=cfg.sha256,
        config=cfg.model_dump(),
        operators={m: op_pins.get(m) for m in ref.codebooks},
        consumed=start.consumed_before + len(new),
        cursor=last,
        offset=offset,
        reference_range=chosen,
        detector=detector.state(),
    )
    for r in rows:
        r["first_sample"] += offset  # counted from the stream's first sample
        r["codebook_sha256"] = ref.sha256
    table = _table(rows, DRIFT_SCHEMA)
    if rebuild and _same_rows(drift_dt, table) and state_matches(pinned, new_state):
        # Rescoring gave exactly what the table holds (e.g. a backfill rewrote identical features):
        # no new version, so a rerun of a backfill changes nothing.
        summary.status += "; rebuilt windows identical to the table: nothing written"
        summary.rows = summary.windows = 0
        summary.alarms_up = sorted(name for name, e in detector.ewma.items() if e.alarm)
        return summary
    _commit(tables, table, new_state, counter, overwrite=rebuild)
    summary.windows = len({r["first_sample"] for r in rows})
    summary.rows = len(rows)
    summary.window_rows = rows
    summary.skipped_metrics = sum(1 for r in rows if r["status"] == "skipped")
    summary.alarms_raised = [
        {
            "metric": r["metric"],
            "window_start": r["window_start"],
            "window_end": r["window_end"],
            "value": float(r["value"]),
            "threshold": float(r["threshold"]),
        }
        for r in rows
        if r["event"] == "raised"
    ]
    summary.alarms_up = sorted(name for name, e in detector.ewma.items() if e.alarm)
    return summary


def _same_rows(dt: Any, table: pa.Table) -> bool:
    if dt is None:
        return False
    keys = [("first_sample", "ascending"), ("metric", "ascending")]
    held = scan(dt, DRIFT_SCHEMA.names)
    if held.num_rows != table.num_rows:
        return False
    return held.select(DRIFT_SCHEMA.names).cast(DRIFT_SCHEMA).sort_by(keys).equals(table.sort_by(keys))


def state_matches(old: DriftState | None, new: DriftState) -> bool:
    """Whether two states are the same state (as the commit metadata would hold them)."""
    return old is not None and old.to_json() == new.to_json()


def _take(samples: Samples, idx: list[int]) -> Samples:
    ix = np.asarray(idx, dtype=np.int64)
    return Samples(
        samples.times[ix],
        [samples.ids[i] for i in idx],
        {m: e[ix] for m, e in samples.embeddings.items()},
        {m: s[ix] for m, s in samples.status.items()},
    )


def _config_diff(old: dict[str, Any], new: dict[str, Any]) -> str:
    diffs = [f"{k} {old.get(k)} -> {new.get(k)}" for k in sorted(new) if old.get(k) != new.get(k)]
    return ", ".join(diffs) or "unknown"
