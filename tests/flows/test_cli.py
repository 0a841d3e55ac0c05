"""The ``mmlake`` command line: one-line errors, and the commands as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from mmlake.flows.cli import main
from mmlake.ingest.broker import free_port
from tests.fixtures.data import table_rows
from tests.fixtures.streams import T0_MS


@pytest.mark.parametrize(
    "argv",
    [
        ["ingest", "--stream", "s"],
        ["ingest", "--topic", "t", "--stream", "s", "--max-records", "0"],
        ["ingest", "--topic", "t", "--stream", "s", "--partitions", "a,b"],
        ["compact", "--stream", "s", "--retention-hours", "-1"],
        ["frobnicate"],
    ],
)
def test_bad_arguments_are_one_line_and_exit_2(argv, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("mmlake") and "error:" in err[-1]


def test_unreachable_broker_is_one_line_and_fast(tmp_path, capsys) -> None:
    started = time.monotonic()
    code = main(
        ["ingest", "--topic", "t", "--stream", "s", "--lake", str(tmp_path), "--bootstrap", f"127.0.0.1:{free_port()}"]
    )
    assert code == 1
    assert time.monotonic() - started < 15
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mmlake: error: cannot reach Kafka at 127.0.0.1:")
    assert not any(tmp_path.iterdir())


def test_bad_environment_setting_is_one_line(monkeypatch, capsys) -> None:
    monkeypatch.setenv("MMLAKE_ALLOWED_LATENESS_S", "soon")
    assert main(["read", "--stream", "s"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "allowed_lateness_s" in err[0]


def test_compact_and_read_on_a_missing_stream(tmp_path, capsys) -> None:
    assert main(["compact", "--stream", "nope", "--lake", str(tmp_path)]) == 1
    assert main(["read", "--stream", "nope", "--lake", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("mmlake: error:") for line in err)


@pytest.mark.slow
def test_produce_ingest_read_compact_as_a_user_would(broker, tmp_path) -> None:
    """The console script in a subprocess, as the README shows it (one Prefect start, ~15 s)."""
    manifest = tmp_path / "m.jsonl"
    manifest.write_text(
        "".join(f'{{"text": "caption {i}", "event_time": {T0_MS + i * 1000}, "sample_id": "s{i}"}}\n' for i in range(5))
    )
    exe = shutil.which("mmlake", path=os.path.dirname(sys.executable))
    assert exe, "the mmlake console script is installed beside the interpreter"
    env = {**os.environ, "MMLAKE_KAFKA_BOOTSTRAP": broker.bootstrap, "MMLAKE_LAKE": str(tmp_path / "lake")}

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([exe, *args], env=env, capture_output=True, text=True, timeout=180)

    produced = run("produce", str(manifest), "--topic", "cli-topic", "--partitions", "2")
    assert produced.returncode == 0, produced.stderr
    assert produced.stdout.strip() == f"produced 5 records to cli-topic at {broker.bootstrap}"
    ingested = run("ingest", "--topic", "cli-topic", "--stream", "cli")
    assert ingested.returncode == 0, ingested.stderr
    last = ingested.stdout.strip().splitlines()[-1]
    assert last.startswith("ingested stream=cli topic=cli-topic: accepted=5 late=0 duplicates=0 dead_lettered=0")
    assert len(table_rows(str(tmp_path / "lake"), "cli", "raw")) == 5

    shown = run("read", "--stream", "cli", "--limit", "3")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.strip().splitlines()
    assert len(lines) == 4 and [line.split()[2] for line in lines[:3]] == ["s0", "s1", "s2"]
    assert lines[3] == "... 2 more rows (--limit N shows more)"  # never a silent cut
    compacted = run("compact", "--stream", "cli")
    assert compacted.returncode == 0, compacted.stderr
    assert "cli/raw: z-ordered by event_time" in compacted.stdout


@pytest.mark.services  # `mmlake broker` in a process of its own
def test_broker_command_serves_until_terminated() -> None:
    import signal

    from mmlake.ingest import wait_for_kafka

    port = free_port()
    exe = shutil.which("mmlake", path=os.path.dirname(sys.executable))
    proc = subprocess.Popen([exe, "broker", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert f"127.0.0.1:{port}" in first
        wait_for_kafka(f"127.0.0.1:{port}", 10)  # answers Kafka requests
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0
    with pytest.raises(Exception, match="cannot reach Kafka"):
        wait_for_kafka(f"127.0.0.1:{port}", 1)  # and is gone


def test_missing_topic_is_one_line_before_prefect_starts(broker, tmp_path, capsys) -> None:
    started = time.monotonic()
    code = main(
        [
            "ingest",
            "--topic",
            "no-such-topic",
            "--stream",
            "s",
            "--lake",
            str(tmp_path),
            "--bootstrap",
            broker.bootstrap,
        ]
    )
    assert code == 1 and time.monotonic() - started < 10
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"mmlake: error: topic 'no-such-topic' does not exist at {broker.bootstrap}"]


def _one_line_error(capsys, argv: list[str], code: int = 1) -> str:
    assert main(argv) == code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mmlake: error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def test_bad_input_is_one_line_without_a_traceback(broker, new_topic, tmp_path, capsys, monkeypatch) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("not a lake")
    assert "is a file" in _one_line_error(capsys, ["read", "--stream", "s", "--lake", str(a_file / "lake")])
    assert "bad time bound" in _one_line_error(
        capsys, ["read", "--stream", "s", "--lake", str(tmp_path), "--from", "100000000000000000"]
    )
    assert "outside years 1..9999" in _one_line_error(
        capsys,
        [
            "backfill",
            "--stream",
            "s",
            "--lake",
            str(tmp_path),
            "--from",
            "2026-01-01T00:00:00Z",
            "--to",
            "99999999999999999",
        ],
    )
    # --partitions naming a partition the topic lacks: refused before Prefect starts or a table exists.
    topic = new_topic(partitions=2)
    started = time.monotonic()
    message = _one_line_error(
        capsys,
        [
            "ingest",
            "--topic",
            topic,
            "--stream",
            "s",
            "--lake",
            str(tmp_path / "lake"),
            "--bootstrap",
            broker.bootstrap,
            "--partitions",
            "1,5",
        ],
    )
    assert "has no partition 5 (it has 2: 0..1)" in message and time.monotonic() - started < 10
    assert not (tmp_path / "lake" / "s").exists()
    # A lake under /proc: refused before Prefect starts.
    assert "cannot create the lake folder /proc/mmlake-lake" in _one_line_error(
        capsys,
        ["ingest", "--topic", topic, "--stream", "s", "--lake", "/proc/mmlake-lake", "--bootstrap", broker.bootstrap],
    )
    tokens = tmp_path / "tokens.json"
    tokens.write_bytes(b'{"t\xff": "team"}')
    assert "is not UTF-8" in _one_line_error(capsys, ["cache", "serve", "--tokens", str(tokens)])
    assert "is a file, not a folder" in _one_line_error(
        capsys, ["cache", "serve", "--tokens", str(tokens), "--snapshot-dir", str(a_file)]
    )
    monkeypatch.setenv("MMLAKE_STORAGE_OPTIONS", "notjson")
    assert "bad setting" in _one_line_error(capsys, ["read", "--stream", "s", "--lake", str(tmp_path)])
    # An object store nobody answers at: delta-rs gives up after its retries, and says so in one line.
    monkeypatch.setenv(
        "MMLAKE_STORAGE_OPTIONS",
        json.dumps(
            {
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
                "AWS_ALLOW_HTTP": "true",
                "AWS_REGION": "us-east-1",
                "AWS_ACCESS_KEY_ID": "x",
                "AWS_SECRET_ACCESS_KEY": "y",
            }
        ),
    )
    unreachable = _one_line_error(capsys, ["read", "--stream", "s", "--lake", "s3://nobody/lake"])
    assert "Error performing GET http://127.0.0.1" in unreachable and "\x1b" not in unreachable


def test_out_of_range_ports_are_refused_by_the_parser(capsys) -> None:
    for argv in (["broker", "--port", "70000"], ["cache", "serve", "--tokens", "t", "--port", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert "argument --port: expected a" in err and "Traceback" not in err


def test_help_says_what_the_tool_promises(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "ends in one line on stderr and a non-zero exit code (2 for bad arguments, 1 for everything else)." in out
