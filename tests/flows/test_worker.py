"""The deployments as a data engineer meets them: a local Prefect server, a process work pool,
``prefect deploy --all``, a ``prefect worker`` and a backfill started with ``prefect deployment run -p``
that writes the lake; the demo schedules are created paused, so nothing fails on its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from deltalake import DeltaTable

from mmlake.ingest.broker import free_port
from tests.preprocessing.helpers import T0_MS, synth_parts, write_raw

#: A Prefect server, a work pool and a worker process.
pytestmark = pytest.mark.services

ROOT = Path(__file__).parents[2]


def _prefect(env: dict[str, str], cwd: Path, *args: str, timeout: float = 120) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "prefect", "--no-prompt", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, f"prefect {' '.join(args)}:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
    return done.stdout


def _api(url: str) -> object:
    request = urllib.request.Request(url, data=b"{}", headers={"Content-Type": "application/json"}, method="POST")
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_deploy_worker_and_a_backfill_run_with_parameters(tmp_path: Path, operator_cache: str) -> None:
    lake = tmp_path / "lake"
    parts = synth_parts(12, span_ms=3_600_000)
    raw = write_raw(str(lake), "s", parts)
    work = tmp_path / "elsewhere"  # deploy and work from outside the repository: no checkout needed
    work.mkdir()
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MMLAKE_"))}
    env.update(
        PREFECT_HOME=str(tmp_path / "prefect"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_UI_ENABLED="false",
        MMLAKE_LAKE=str(lake),
        MMLAKE_PREPROCESS_CACHE_DIR=operator_cache,
    )
    server = subprocess.Popen(
        [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    worker = None
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{api}/health", timeout=2):
                    break
            except OSError:
                assert server.poll() is None and time.monotonic() < deadline, "the Prefect server did not start"
                time.sleep(0.5)
        env["PREFECT_API_URL"] = api
        _prefect(env, work, "work-pool", "create", "mmlake", "--type", "process")
        _prefect(env, work, "deploy", "--all", "--prefect-file", str(ROOT / "flows" / "prefect.yaml"), timeout=180)
        deployments = {d["name"]: d for d in _api(f"{api}/deployments/filter")}  # type: ignore[union-attr]
        assert set(deployments) == {"pipeline-demo", "cache-warmup-demo", "backfill"}
        for name in ("pipeline-demo", "cache-warmup-demo"):
            assert [s["active"] for s in deployments[name]["schedules"]] == [False], name  # created paused
        assert deployments["backfill"]["pull_steps"] in (None, [])

        log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen(
            [sys.executable, "-m", "prefect", "worker", "start", "--pool", "mmlake"],
            env=env,
            cwd=work,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        plan = {"start": "2026-01-01T00:00:00Z", "end": "2026-01-02T00:00:00Z", "stages": "preprocess"}
        started = _prefect(
            env, work, "deployment", "run", "backfill/backfill", "-p", "stream=s", "-p", f"plan={json.dumps(plan)}"
        )
        run_id = next(line.split()[-1] for line in started.splitlines() if "UUID" in line)
        state = None
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{api}/flow_runs/{run_id}", timeout=10) as response:
                state = json.loads(response.read())["state"]["type"]
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                break
            time.sleep(1)
        assert state == "COMPLETED", (tmp_path / "worker.log").read_text()[-3000:]
        features = DeltaTable(str(lake / "s" / "features")).to_pyarrow_table(columns=["record_id", "event_time"])
        expected = {
            r
            for r, t in zip(raw.column("record_id").to_pylist(), raw.column("event_time").cast("int64").to_pylist())
            if t < T0_MS * 1000 + 86_400_000_000
        }
        assert set(features.column("record_id").to_pylist()) == expected and expected
        # The paused demo schedules made no runs (the backfill's per-day child runs have no deployment).
        runs = _api(f"{api}/flow_runs/filter")
        assert {r["deployment_id"] for r in runs if r["deployment_id"]} == {deployments["backfill"]["id"]}  # type: ignore[union-attr]
    finally:
        for proc in (worker, server):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
