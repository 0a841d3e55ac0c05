"""The ground floor (mmlake.lake): time helpers, string-safe reads and the one exactly-once commit,
against real Delta tables."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from mmlake.errors import CommitRaceLost, InputError
from mmlake.lake import (
    US_PER_DAY,
    StreamTables,
    commit,
    day_of,
    days,
    format_us,
    iso_us,
    parse_event_time,
    scan,
    time_range,
    txn_version,
)

SCHEMA = pa.schema([("k", pa.string()), ("v", pa.int64())])
APP = "test-app/s"


def _rows(*values: int) -> pa.Table:
    return pa.table({"k": [f"k{v}" for v in values], "v": list(values)}, schema=SCHEMA)


def test_days_cut_at_utc_midnights_and_cover_the_range() -> None:
    lo = 3 * US_PER_DAY - 5
    hi = 5 * US_PER_DAY + 7
    parts = days(lo, hi)
    assert parts == [
        (lo, 3 * US_PER_DAY),
        (3 * US_PER_DAY, 4 * US_PER_DAY),
        (4 * US_PER_DAY, 5 * US_PER_DAY),
        (5 * US_PER_DAY, hi),
    ]
    assert days(hi, hi) == []
    assert day_of(-1) == -1 and day_of(0) == 0  # before 1970 is the day before, as Arrow's date32 has it


def test_times_parse_and_format_as_rfc3339() -> None:
    instant = datetime(2026, 1, 2, 3, 4, 5, 600_000, tzinfo=UTC)
    us = int(instant.timestamp()) * 1_000_000 + 600_000
    assert parse_event_time("2026-01-02T03:04:05.6Z") == us
    assert parse_event_time(str(us // 1000)) == us
    assert format_us(us) == "2026-01-02T03:04:05.600000Z"
    assert iso_us(us) == "2026-01-02T03:04:05.600000Z"
    assert format_us(None) == "-"
    # Never raises, even for an instant datetime cannot hold (formatting runs after commits).
    assert format_us(10**20) == f"{10**20}us"
    assert time_range("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z") == (
        us - us % US_PER_DAY - US_PER_DAY,
        us - us % US_PER_DAY,
    )
    with pytest.raises(InputError, match=r"--from must be before --to \(got 2000 .. 1000\)"):
        time_range("2000", "1000")
    with pytest.raises(InputError, match="bad time bound"):
        time_range("yesterday", "1000")
    with pytest.raises(InputError, match="a backfill needs"):
        time_range("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z", requirement="a backfill needs it")


def test_a_commit_holds_rows_txns_and_metadata_in_one_version(tmp_path) -> None:
    tables = StreamTables(str(tmp_path), "s")
    dt = tables.ensure("t", SCHEMA)
    assert txn_version(dt, APP) == -1
    assert commit(dt, _rows(1, 2), txns={APP: 0, "other": 41}, expect={APP: -1}, metadata={"who": "me"})
    fresh = DeltaTable(tables.uri("t"))
    assert fresh.version() == 1  # created at 0, one commit
    assert (txn_version(fresh, APP), txn_version(fresh, "other")) == (0, 41)
    assert fresh.to_pyarrow_table().column("v").to_pylist() == [1, 2]
    assert fresh.history(1)[0]["who"] == "me"


def test_nothing_to_commit_writes_nothing(tmp_path) -> None:
    dt = StreamTables(str(tmp_path), "s").ensure("t", SCHEMA)
    assert commit(dt, SCHEMA.empty_table(), txns={}, expect={APP: -1}) is False
    assert DeltaTable(f"{tmp_path}/s/t").version() == 0
    # An empty commit that moves a txn is a commit (progress without rows).
    assert commit(dt, SCHEMA.empty_table(), txns={APP: 0}, expect={APP: -1}) is True
    assert txn_version(DeltaTable(f"{tmp_path}/s/t"), APP) == 0


def test_a_rival_inside_the_snapshot_is_refused(tmp_path) -> None:
    """delta-rs refreshes a table after it commits: a plan made before is stale, which Delta's own
    check (it looks only at commits after the snapshot) cannot see."""
    dt = StreamTables(str(tmp_path), "s").ensure("t", SCHEMA)
    commit(dt, _rows(1), txns={APP: 0}, expect={APP: -1})
    with pytest.raises(CommitRaceLost, match="planned at -1"):
        commit(dt, _rows(2), txns={APP: 0}, expect={APP: -1})
    assert DeltaTable(f"{tmp_path}/s/t").to_pyarrow_table().column("v").to_pylist() == [1]


def test_a_rival_after_the_snapshot_is_refused_by_delta(tmp_path) -> None:
    tables = StreamTables(str(tmp_path), "s")
    tables.ensure("t", SCHEMA)
    mine, theirs = DeltaTable(tables.uri("t")), DeltaTable(tables.uri("t"))
    commit(theirs, _rows(1), txns={APP: 0}, expect={APP: -1})
    with pytest.raises(CommitRaceLost, match="another writer committed first"):
        commit(mine, _rows(2), txns={APP: 0}, expect={APP: -1})  # planned from the old snapshot
    assert DeltaTable(tables.uri("t")).to_pyarrow_table().column("v").to_pylist() == [1]


def test_a_commit_may_create_its_table_and_replace_by_predicate(tmp_path) -> None:
    tables = StreamTables(str(tmp_path), "s")
    assert commit(tables.uri("new"), _rows(1, 2, 3), txns={APP: 0}, expect={APP: -1}, name="s.new")
    dt = tables.open("new")
    assert dt is not None and dt.metadata().name == "s.new" and txn_version(dt, APP) == 0
    commit(
        dt,
        _rows(20),
        txns={APP: 1},
        expect={APP: 0},
        mode="overwrite",
        predicate="v >= 2",
        metadata={"state": json.dumps({"n": 1})},
    )
    assert sorted(DeltaTable(tables.uri("new")).to_pyarrow_table().column("v").to_pylist()) == [1, 20]


def test_scan_gives_plain_strings_after_a_rewrite(tmp_path) -> None:
    tables = StreamTables(str(tmp_path), "s")
    dt = tables.ensure("t", SCHEMA)
    for v in range(3):
        commit(dt, _rows(v), txns={APP: v}, expect={APP: v - 1})
    DeltaTable(tables.uri("t")).optimize.compact()
    dt = DeltaTable(tables.uri("t"))
    table = scan(dt, ["k", "v"])
    assert table.schema.field("k").type == pa.string()
    assert sorted(table.column("k").to_pylist()) == ["k0", "k1", "k2"]
    assert txn_version(dt, APP) == 2  # optimize rewrites files, never the txn actions


_READ_AND_EXIT = """
import sys
import pyarrow.dataset as ds
from deltalake import DeltaTable
from mmlake.lake import count_rows, scan
dt = DeltaTable(sys.argv[1])
assert count_rows(dt, ds.field("v") < 3) == 30 * 3
assert scan(dt, ["k"]).num_rows == 30 * 20  # the last thing the process does
"""


@pytest.mark.slow
def test_a_process_that_reads_a_table_exits_cleanly(tmp_path) -> None:
    """A threaded Arrow scan just before exit aborted about half of such processes (exit -6,
    "terminate called without an active exception"); reads go through the calling thread."""
    import subprocess
    import sys

    uri = str(tmp_path / "t")
    for _ in range(30):  # many small files, as a micro-batched table has
        commit(uri if not (tmp_path / "t").exists() else DeltaTable(uri), _rows(*range(20)), txns={})
    for attempt in range(8):
        done = subprocess.run([sys.executable, "-c", _READ_AND_EXIT, uri], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"attempt {attempt}: exit {done.returncode}: {done.stderr.strip()[-300:]}"
