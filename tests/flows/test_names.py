"""Stream and topic names: checked before anything is created, in one line naming the rule; nothing is
ever addressed outside ``<lake>/<stream>/``; what Prefect derives from a valid name is valid too."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from mmlake.errors import InputError
from mmlake.flows.cli import main
from mmlake.flows.stages import artifact_key
from mmlake.lake import StreamTables, check_stream_name, table_uri

HOSTILE = [
    "",
    ".",
    "..",
    "../escape",
    "a/b",
    "/abs",
    "my stream",
    "ström日本",
    "a..b",
    "-x",
    "_x",
    "x" * 201,
    "a\\b",
    "tab\there",
    "new\nline",
    "%2e%2e",
]
VALID = ["s", "frames", "Frames_v2", "a.b-c", "0", "x" * 200, "demo-pairs"]

#: Every command that takes --stream, with what else it needs (LAKE is replaced by the test's lake).
STREAM_COMMANDS = [
    ["ingest", "--topic", "t"],
    ["compact"],
    ["read"],
    ["serve", "--topic", "t"],
    ["lineage", "explain", "--record-id", "x"],
    ["preprocess"],
    ["drift"],
    ["backfill", "--from", "2026-01-01T00:00:00Z", "--to", "2026-01-02T00:00:00Z"],
]
TOPIC_COMMANDS = [["ingest", "--stream", "s"], ["serve", "--stream", "s"], ["produce", "."]]


@pytest.mark.parametrize("name", VALID)
def test_valid_names_are_kept_as_they_are(name: str, tmp_path: Path) -> None:
    assert check_stream_name(name) == name
    assert table_uri(str(tmp_path), name, "raw") == f"{tmp_path}/{name}/raw"
    # Prefect's rule for artifact keys: lowercase letters, digits and dashes.
    assert re.fullmatch(r"[a-z0-9-]+", artifact_key("ingest", name))


@pytest.mark.parametrize("name", HOSTILE)
def test_the_library_refuses_a_name_that_could_leave_the_stream_folder(name: str, tmp_path: Path) -> None:
    with pytest.raises(InputError, match="is not allowed: use letters, digits"):
        check_stream_name(name)
    with pytest.raises(InputError):
        StreamTables(str(tmp_path), name)
    with pytest.raises(InputError):
        table_uri(str(tmp_path), name, "raw")


@pytest.mark.parametrize("command", STREAM_COMMANDS, ids=lambda c: " ".join(c[:2]))
def test_every_command_refuses_a_hostile_stream_name_in_one_line_before_creating_anything(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lake = tmp_path / "lake"
    for name in HOSTILE:
        with pytest.raises(SystemExit) as exit_info:
            main([*command, f"--stream={name}", "--lake", str(lake)])
        assert exit_info.value.code == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert "is not allowed" in err[-1] and "--stream" in err[-1], (name, err)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no lake, nothing beside it


@pytest.mark.parametrize("command", TOPIC_COMMANDS, ids=lambda c: c[0])
def test_every_command_refuses_a_hostile_topic_name(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in ["", ".", "..", "a/b", "my topic", "ström", "x" * 250]:
        with pytest.raises(SystemExit) as exit_info:
            main(
                [*command, f"--topic={name}", "--lake", str(tmp_path / "lake")]
                if command[0] != "produce"
                else [*command, f"--topic={name}"]
            )
        assert exit_info.value.code == 2, name
        err = capsys.readouterr().err.strip().splitlines()
        assert "topic name" in err[-1] and "is not allowed" in err[-1], (name, err)
    assert not (tmp_path / "lake").exists()


def test_the_cli_process_writes_nothing_outside_the_lake(tmp_path: Path) -> None:
    """As a user runs it: ``--stream ../escape`` ends in one line and exit 2, and neither the lake nor
    ``<lake>/../escape`` is created."""
    lake = tmp_path / "lake"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mmlake.flows.cli",
            "ingest",
            "--topic",
            "t",
            "--stream",
            "../escape",
            "--lake",
            str(lake),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert "stream name '../escape' is not allowed" in lines[-1] and "Traceback" not in done.stderr
    assert not lake.exists() and not (tmp_path / "escape").exists()
