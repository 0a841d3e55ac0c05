"""The ground floor every stage stands on: where a stream's tables live, event-time arithmetic,
string-safe reads, and the one exactly-once Delta commit that ingest, preprocessing, drift and the
cache warm-up all make.

Times are UTC epoch microseconds (``int``) throughout; ``UTC_US`` is their Arrow type.

The exactly-once commit (:func:`commit`), after kafka-delta-ingest: a writer records its progress as
Delta ``txn`` actions (an app id and a version: a Kafka offset, a run counter) in the *same* commit as
its rows, so rows and progress land together or not at all. Before committing, the versions the
writer planned from are compared with the table snapshot it holds: when another writer's commit is
already inside the snapshot (delta-rs refreshes it after each commit), Delta's own conflict check,
which only looks at commits after the snapshot, would not see it. Either way the commit is refused
with :class:`~mmlake.errors.CommitRaceLost` and the writer re-plans.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import pyarrow as pa

from mmlake.errors import CommitRaceLost, InputError

if TYPE_CHECKING:
    from deltalake import DeltaTable

UTC_US = pa.timestamp("us", tz="UTC")
US_PER_DAY = 86_400_000_000
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- event time ---------------------------------------------------------------------------------


def day_of(us: int) -> int:
    """The UTC day (days since 1970-01-01, the ``event_date`` partition value) holding ``us``."""
    return us // US_PER_DAY


def days(lo_us: int, hi_us: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` cut at UTC midnights, in order.

    >>> days(US_PER_DAY - 1, US_PER_DAY + 1)
    [(86399999999, 86400000000), (86400000000, 86400000001)]
    """
    out = []
    at = lo_us
    while at < hi_us:
        nxt = min((day_of(at) + 1) * US_PER_DAY, hi_us)
        out.append((at, nxt))
        at = nxt
    return out


#: The event times the tables hold: years 1 to 9999 in UTC, what RFC 3339's four-digit years, Python's
#: datetime and Delta's date partition values all share.
MIN_EVENT_US = -62_135_596_800_000_000  # 0001-01-01T00:00:00Z
MAX_EVENT_US = 253_402_300_799_999_999  # 9999-12-31T23:59:59.999999Z

_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
    r"(?:([Zz])|([+-])([0-9]{2}):([0-9]{2}))"
)


class EventTimeOutOfRange(ValueError):
    """A well-formed event time outside ``MIN_EVENT_US .. MAX_EVENT_US``."""


def in_range(us: int) -> bool:
    """Whether ``us`` lies in the range the tables hold (years 1 to 9999, UTC)."""
    return MIN_EVENT_US <= us <= MAX_EVENT_US


def parse_event_time(text: str) -> int:
    """Parse an event time into UTC epoch microseconds.

    Accepts RFC 3339 with a UTC offset (``Z`` or ``+hh:mm``; a lower-case ``t`` and ``z`` are allowed,
    fractions beyond microseconds are cut) or an integer of epoch milliseconds, in ASCII digits, with
    no surrounding space. Anything else (ISO 8601's basic or week forms, a missing offset or seconds,
    other digits) raises ``ValueError`` with a one-line message; a time outside years 1 to 9999 raises
    :class:`EventTimeOutOfRange`.

    >>> parse_event_time("1700000000000")
    1700000000000000
    >>> parse_event_time("2023-11-14T22:13:20.5+00:00")
    1700000000500000
    """
    if not text:
        raise ValueError("empty")
    digits = text[1:] if text[0] == "-" else text
    if digits.isascii() and digits.isdigit():  # epoch ms (isdigit alone would take '２' and '²')
        if len(digits) > 16:  # beyond ~317,000 years: out of range before int() has to cope with it
            raise EventTimeOutOfRange(f"{text[:24]}{'...' if len(text) > 24 else ''} is outside years 1..9999 (UTC)")
        us = int(text) * 1000
    else:
        m = _RFC3339.fullmatch(text)
        if m is None:
            raise ValueError(
                f"not RFC 3339 (YYYY-MM-DDTHH:MM:SS[.frac](Z|+hh:mm)) or epoch milliseconds: {text[:64]!r}"
            )
        if m.group(6) == "60":
            raise ValueError(f"leap seconds are not supported: {text[:64]!r}")
        try:  # the grammar is RFC 3339's now; fromisoformat checks the calendar and converts
            delta = datetime.fromisoformat(text.upper()) - _EPOCH
        except ValueError as err:
            raise ValueError(f"{err}: {text[:64]!r}") from None
        us = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    if not in_range(us):
        raise EventTimeOutOfRange(f"{text[:64]} is outside years 1..9999 (UTC)")
    return us


def to_epoch_us(value: datetime | str | int | None) -> int | None:
    """A time bound as UTC epoch microseconds: an aware datetime, RFC 3339 text or epoch milliseconds.
    None stays None; anything else unusable is an :class:`InputError`."""
    if value is None:
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise InputError("time bounds need a timezone (naive datetimes are ambiguous)")
        return (value - datetime(1970, 1, 1, tzinfo=UTC)) // timedelta(microseconds=1)
    try:
        return parse_event_time(str(value))
    except ValueError as err:
        raise InputError(f"bad time bound: {err}") from None


def time_range(
    start: datetime | str | int, end: datetime | str | int, *, requirement: str = "--from must be before --to"
) -> tuple[int, int]:
    """``(lo, hi)`` of a half-open range ``[start, end)``; an :class:`InputError` saying
    ``requirement`` unless both bounds parse and ``start < end``."""
    lo, hi = to_epoch_us(start), to_epoch_us(end)
    if lo is None or hi is None or hi <= lo:
        raise InputError(f"{requirement} (got {start} .. {end})")
    return lo, hi


def format_us(us: int | None) -> str:
    """``us`` as RFC 3339 in UTC (``...Z``), ``-`` for None. Never raises: an instant Python's
    datetime cannot hold is written as ``<us>us``."""
    if us is None:
        return "-"
    try:
        return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat().replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"{us}us"


def iso_us(us: int) -> str:
    """``us`` as a fixed-width RFC 3339 timestamp with microseconds (for predicates and metadata)."""
    return datetime.fromtimestamp(us / 1e6, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# -- locations ----------------------------------------------------------------------------------


def is_local(lake: str) -> bool:
    """Whether ``lake`` is a path on this machine (a plain path or ``file://``), not an object store."""
    return "://" not in lake or lake.startswith("file://")


def lake_root(lake: str) -> str:
    """The lake's root as tables are addressed: a local path made absolute, a URI as given."""
    if "://" not in lake:
        lake = os.path.abspath(lake)
    return lake.rstrip("/")


def check_lake(lake: str, *, create: bool = False) -> None:
    """A one-line :class:`InputError` for a local lake that cannot be one: a path on a file, or under a
    folder that is not writable; with ``create``, the lake's folder is made now (a writer's first step),
    so that a path no folder can exist at (under ``/proc``, say) is refused before any work starts.
    Object-store lakes are checked by their first request."""
    if not is_local(lake):
        return
    path = os.path.abspath(lake.removeprefix("file://"))
    if create and not os.path.isdir(path):
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as err:
            raise InputError(f"cannot create the lake folder {path}: {err.strerror or err}") from None
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise InputError(f"lake {lake} cannot be a folder: {probe} is a file")
    if probe != path and not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"lake {lake} cannot be created: {probe} is not writable")


#: What a stream (and so its folder under the lake) may be called: ASCII letters and digits, then also
#: ``.``, ``_`` and ``-``, at most 200 characters, never ``..``. A name can neither leave
#: ``<lake>/<stream>/`` nor clash with the lake's own folders (``_lineage``, ``_plots``).
STREAM_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
STREAM_NAME_RULE = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 200, no '..'"


def check_stream_name(stream: str) -> str:
    """``stream`` when it is a valid stream name (:data:`STREAM_NAME`); a one-line :class:`InputError`
    naming the rule otherwise."""
    if not isinstance(stream, str) or not STREAM_NAME.fullmatch(stream) or ".." in stream:
        raise InputError(f"stream name {str(stream)[:80]!r} is not allowed: use {STREAM_NAME_RULE}")
    return stream


def table_uri(lake: str, stream: str, table: str) -> str:
    """Location of ``<lake>/<stream>/<table>``; a local lake path is made absolute. The stream name is
    checked (:func:`check_stream_name`): nothing outside ``<lake>/<stream>/`` is ever addressed."""
    return f"{lake_root(lake)}/{check_stream_name(stream)}/{table}"


@dataclass(frozen=True)
class StreamTables:
    """The locations of one stream's tables and the storage options to open them with."""

    lake: str
    stream: str
    storage_options: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_stream_name(self.stream)

    def uri(self, table: str) -> str:
        return table_uri(self.lake, self.stream, table)

    @property
    def options(self) -> dict[str, str] | None:
        """The storage options as deltalake takes them (None for none)."""
        return dict(self.storage_options) or None

    def open(self, table: str) -> DeltaTable | None:
        """The table at its latest version, or None if it does not exist yet."""
        from deltalake import DeltaTable
        from deltalake.exceptions import TableNotFoundError

        try:
            return DeltaTable(self.uri(table), storage_options=self.options)
        except TableNotFoundError:
            return None

    def exists(self, table: str) -> bool:
        return self.open(table) is not None

    def ensure(self, table: str, schema: pa.Schema, partition_by: list[str] | None = None) -> DeltaTable:
        """Open the table, creating it empty (with ``schema`` and partitioning) if it is missing.
        Safe when another writer creates it at the same moment: theirs is opened."""
        from deltalake import DeltaTable
        from deltalake.exceptions import DeltaError

        existing = self.open(table)
        if existing is not None:
            return existing
        try:
            return DeltaTable.create(
                self.uri(table),
                schema,
                mode="ignore",
                partition_by=partition_by or None,
                storage_options=self.options,
                name=f"{self.stream}.{table}",
            )
        except DeltaError:
            found = self.open(table)
            if found is None:
                raise
            return found


# -- reads --------------------------------------------------------------------------------------


def dataset(dt: DeltaTable) -> tuple[Any, bool]:
    """The table as a pyarrow dataset, and whether Arrow's own threads may scan it.

    deltalake reads files through a Python filesystem handler, which Arrow's IO threads call back into;
    such a scan just before the process exits can abort it ("terminate called without an active
    exception", apache/arrow#39862): half of the short processes reading a table did here, a finished
    ingest run among them. A local table is read through Arrow's native local filesystem instead
    (threads allowed); a table on an object store keeps deltalake's handler and is scanned on the
    calling thread (``use_threads=False``), which makes the abort rare, not impossible.
    """
    uri = dt.table_uri
    if uri.startswith("file://"):
        from urllib.parse import unquote, urlparse

        import pyarrow.fs as pafs

        local = pafs.SubTreeFileSystem(unquote(urlparse(uri).path), pafs.LocalFileSystem())
        return dt.to_pyarrow_dataset(filesystem=local), True
    return dt.to_pyarrow_dataset(), False


def scan(dt: DeltaTable, columns: list[str] | None = None, filter: Any = None) -> pa.Table:
    """Columns of a Delta table, strings as plain ``string``. Every read of a table goes through here,
    :func:`count_rows` or :func:`dataset`.

    Files rewritten by delta-rs (compaction, delete, predicate overwrite) may hold ``string_view``
    columns, which Arrow will not compare with ``string``: apply string predicates to the result, never
    inside the scan (``filter`` is for times, dates and numbers).
    """
    data, threads = dataset(dt)
    table = data.to_table(columns=columns, filter=filter, use_threads=threads)
    for i, f in enumerate(table.schema):
        if pa.types.is_string_view(f.type) or pa.types.is_large_string(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(pa.string()))
    return table


def count_rows(dt: DeltaTable, filter: Any = None) -> int:
    """How many rows of a Delta table match ``filter`` (all without one); see :func:`dataset`."""
    data, threads = dataset(dt)
    return int(data.count_rows(filter=filter, use_threads=threads))


# -- the exactly-once commit --------------------------------------------------------------------


def app_id(stage: str, name: str, *parts: str | int) -> str:
    """The Delta ``txn`` app id under which one stage records its progress: ``mmlake-<stage>/<name>``
    followed by ``/<part>`` for each of ``parts`` (e.g. ``mmlake-ingest/<topic>/<partition>``). Every
    stage spells its ids through this one rule; the ids are part of the tables' contract."""
    return "/".join((f"mmlake-{stage}", name, *map(str, parts)))


def offset_app_id(topic: str, partition: int) -> str:
    """The ``txn`` app id whose version is the last Kafka offset of a partition a table holds."""
    return app_id("ingest", topic, partition)


def max_event_app_id(topic: str, partition: int) -> str:
    """The ``txn`` app id whose version is a partition's max event time (UTC epoch µs)."""
    return app_id("ingest", topic, partition, "max-event-time-us")


def txn_version(dt: DeltaTable | None, app_id: str) -> int:
    """The version the table's ``txn`` action ``app_id`` holds, -1 when it has none (or no table)."""
    if dt is None:
        return -1
    value = dt.transaction_version(app_id)
    return -1 if value is None else int(value)


def check_snapshot(dt: DeltaTable | None, expect: Mapping[str, int]) -> None:
    """Raise :class:`CommitRaceLost` unless every ``txn`` app id in ``expect`` holds the expected
    version (-1: none) in the snapshot ``dt``."""
    for app_id, version in expect.items():
        current = txn_version(dt, app_id)
        if current != version:
            raise CommitRaceLost(f"{app_id} is at {current} in the table, this commit was planned at {version}")


def commit(
    target: DeltaTable | str,
    data: pa.Table,
    *,
    txns: Mapping[str, int],
    expect: Mapping[str, int] | None = None,
    metadata: Mapping[str, str] | None = None,
    mode: Literal["append", "overwrite"] = "append",
    predicate: str | None = None,
    partition_by: list[str] | None = None,
    storage_options: dict[str, str] | None = None,
    name: str | None = None,
) -> bool:
    """One Delta commit: ``data`` (appended, or with ``mode="overwrite"`` replacing the table or the
    rows ``predicate`` selects), one ``txn`` action per ``txns`` entry (app id -> new version) and
    ``metadata`` as the commit's custom metadata.

    ``target`` is the table as the writer planned from it, or a URI where no table exists yet (created
    by this commit, with ``storage_options`` and ``name``). ``expect`` (app id -> version, -1 for none)
    is what the writer's plan assumed; see the module docstring. Returns False, writing nothing, when
    there is nothing to commit (no rows, no txn). Raises :class:`CommitRaceLost` when another writer
    got there first.
    """
    from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
    from deltalake.exceptions import CommitFailedError

    dt = target if isinstance(target, DeltaTable) else None
    check_snapshot(dt, expect or {})
    if not txns and data.num_rows == 0:
        return False
    properties = CommitProperties(
        app_transactions=[Transaction(app, int(v)) for app, v in txns.items()], custom_metadata=dict(metadata or {})
    )
    where: dict[str, Any] = {
        "partition_by": partition_by or None,
        "commit_properties": properties,
        "storage_options": None if dt is not None else (storage_options or None),
        "name": None if dt is not None else name,
    }
    try:
        if mode == "overwrite":
            write_deltalake(target, data, mode="overwrite", predicate=predicate, **where)
        else:
            write_deltalake(target, data, mode="append", **where)
    except CommitFailedError as err:
        raise CommitRaceLost(f"another writer committed first: {err}".splitlines()[0]) from err
    return True
