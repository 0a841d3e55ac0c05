"""``mmlake serve`` as a user runs it: a scheduled pipeline run (ingest, then preprocess, then drift)
is observed to complete."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from tests.fixtures.streams import T0_MS


@pytest.mark.slow
def test_served_deployment_runs_on_its_schedule(broker, producer, new_topic, tmp_path, operator_cache) -> None:
    topic = new_topic()
    for i in range(5):
        producer.send(topic, f"scheduled {i}".encode(), "text", event_time=T0_MS + i, partition=0)
    producer.flush()
    lake = tmp_path / "lake"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_API", "MMLAKE_"))}
    env.update(
        MMLAKE_LAKE=str(lake),
        MMLAKE_KAFKA_BOOTSTRAP=broker.bootstrap,
        PREFECT_HOME=str(tmp_path / "prefect"),
        MMLAKE_PREPROCESS_CACHE_DIR=operator_cache,
    )
    exe = shutil.which("mmlake", path=os.path.dirname(sys.executable))
    log = (tmp_path / "serve.log").open("w")
    proc = subprocess.Popen(
        [exe, "serve", "--topic", topic, "--stream", "s", "--interval", "5"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    rows = features = 0
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                rows = DeltaTable(str(lake / "s" / "raw")).to_pyarrow_dataset().count_rows()
                features = DeltaTable(str(lake / "s" / "features")).to_pyarrow_dataset().count_rows()
            except TableNotFoundError:
                pass
            if rows == 5 and features == 5:
                break
            time.sleep(1)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
    output = (tmp_path / "serve.log").read_text()
    assert rows == 5 and features == 5, output[-3000:]  # ingested, then preprocessed by the same pipeline run
    assert "started a local Prefect server" in output
