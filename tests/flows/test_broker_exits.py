"""``mmlake broker`` as a supervisor runs it: a busy port is refused in one line, and the broker process
never outlives the command, whatever signal ends it (issue 28, honest exits)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

from mmlake.ingest import wait_for_kafka
from mmlake.ingest.broker import free_port

pytestmark = pytest.mark.services  # `mmlake broker` processes

EXE = shutil.which("mmlake", path=os.path.dirname(sys.executable)) or "mmlake"


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_a_busy_port_is_refused_in_one_line() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        started = time.monotonic()
        done = subprocess.run([EXE, "broker", "--port", str(port)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"mmlake: error: port {port} on 127.0.0.1 is in use: stop what listens there, or choose another --port"
    ]
    assert "Ctrl-C stops it" not in done.stdout
    assert time.monotonic() - started < 20


def test_the_broker_dies_with_the_command_even_on_sigkill() -> None:
    port = free_port()
    proc = subprocess.Popen([EXE, "broker", "--port", str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and f"127.0.0.1:{port}" in proc.stdout.readline()
        wait_for_kafka(f"127.0.0.1:{port}", 10)
        proc.send_signal(signal.SIGKILL)  # as the OOM killer or a supervisor's hard stop does
        proc.wait(10)
        deadline = time.monotonic() + 15
        while _listening(port) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _listening(port), "the broker outlived `mmlake broker`"
        # So a restart on the same port comes up at once, and is a fresh broker.
        again = subprocess.Popen([EXE, "broker", "--port", str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert again.stdout is not None and f"127.0.0.1:{port}" in again.stdout.readline()
            wait_for_kafka(f"127.0.0.1:{port}", 10)
        finally:
            again.send_signal(signal.SIGTERM)
            assert again.wait(15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
