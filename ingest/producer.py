"""Producing multimodal records in the wire format: a Python helper and the ``mmlake produce`` loader."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mmlake.errors import InputError
from mmlake.ingest import wire
from mmlake.ingest.broker import wait_for_kafka
from mmlake.ingest.errors import BrokerUnavailableError

EXTENSION_MODALITY = {
    ".png": "image",
    ".jpg": "image",
    ".jpeg": "image",
    ".wav": "audio",
    ".txt": "text",
}


def _event_time_text(event_time: datetime | int | str) -> str:
    if isinstance(event_time, datetime):
        if event_time.tzinfo is None:
            raise InputError("event_time needs a timezone (naive datetimes are ambiguous)")
        return event_time.astimezone(UTC).isoformat()
    return str(event_time)


def topic_exists(bootstrap: str, topic: str, timeout_s: float = 10.0) -> bool:
    """Whether the cluster at ``bootstrap`` has ``topic``."""
    from kafka import KafkaAdminClient
    from kafka.errors import KafkaError

    wait_for_kafka(bootstrap, timeout_s)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        return topic in admin.list_topics()
    except KafkaError as err:
        raise BrokerUnavailableError(f"cannot list topics at {bootstrap}: {err}") from err
    finally:
        admin.close()


def topic_partitions(bootstrap: str, topic: str, timeout_s: float = 10.0) -> list[int]:
    """The partition numbers of ``topic`` (empty when it does not exist)."""
    from kafka import KafkaConsumer
    from kafka.errors import KafkaError

    wait_for_kafka(bootstrap, timeout_s)
    consumer = KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=int(max(timeout_s, 5) * 1000) + 1000,
    )
    try:
        return sorted(consumer.partitions_for_topic(topic) or [])
    except KafkaError as err:
        raise BrokerUnavailableError(f"cannot read the partitions of {topic!r} at {bootstrap}: {err}") from err
    finally:
        consumer.close()


def ensure_topic(bootstrap: str, topic: str, partitions: int = 1, timeout_s: float = 10.0) -> None:
    """Create ``topic`` with ``partitions`` partitions unless it exists."""
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    wait_for_kafka(bootstrap, timeout_s)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(timeout_s * 1000))
    try:
        if topic in admin.list_topics():
            return
        admin.create_topics([NewTopic(topic, partitions, 1)])
    except TopicAlreadyExistsError:
        pass
    except KafkaError as err:
        raise BrokerUnavailableError(f"cannot create topic {topic!r} at {bootstrap}: {err}") from err
    finally:
        admin.close()


class MultimodalProducer:
    """Sends parts of multimodal samples to Kafka with the mmlake headers.

    >>> with MultimodalProducer("127.0.0.1:9092") as producer:  # doctest: +SKIP
    ...     producer.send("frames", b"a cat", "text", event_time=1700000000000, sample_id="s1")
    """

    def __init__(self, bootstrap: str, *, timeout_s: float = 10.0, **config: Any) -> None:
        from kafka import KafkaProducer

        wait_for_kafka(bootstrap, timeout_s)
        self._producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            linger_ms=5,
            max_request_size=64 * 1024 * 1024,
            **config,
        )

    def send(
        self,
        topic: str,
        payload: bytes,
        modality: str,
        *,
        event_time: datetime | int | str,
        key: str | None = None,
        sample_id: str | None = None,
        record_id: str | None = None,
        content_type: str | None = None,
        partition: int | None = None,
        extra_headers: list[tuple[str, bytes]] | None = None,
    ) -> Any:
        """Send one part; ``event_time`` is an aware datetime, epoch milliseconds or RFC 3339 text."""
        headers = [
            (wire.HEADER_EVENT_TIME, _event_time_text(event_time).encode()),
            (wire.HEADER_MODALITY, modality.encode()),
        ]
        for name, value in (
            (wire.HEADER_CONTENT_TYPE, content_type),
            (wire.HEADER_RECORD_ID, record_id),
            (wire.HEADER_SAMPLE_ID, sample_id),
        ):
            if value is not None:
                headers.append((name, value.encode()))
        headers.extend(extra_headers or [])
        key = key if key is not None else sample_id
        return self._producer.send(
            topic,
            value=payload,
            key=key.encode() if key is not None else None,
            headers=headers,
            partition=partition,
        )

    def send_raw(
        self,
        topic: str,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        *,
        key: bytes | None = None,
        partition: int | None = None,
    ) -> Any:
        """Send a record exactly as given (for replaying dead letters or testing bad input)."""
        return self._producer.send(topic, value=value, key=key, headers=headers, partition=partition)

    def flush(self) -> None:
        self._producer.flush()

    def close(self) -> None:
        self._producer.flush()
        self._producer.close()

    def __enter__(self) -> MultimodalProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Part:
    """One part to produce, as read from a folder or a manifest."""

    payload: bytes
    modality: str
    event_time: str
    sample_id: str | None
    content_type: str | None = None
    record_id: str | None = None


def parts_from_folder(folder: Path) -> Iterator[Part]:
    """Files by extension (.png .jpg .jpeg .wav .txt); sample id = file stem; event time = mtime."""
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        modality = EXTENSION_MODALITY.get(path.suffix.lower())
        if modality is None:
            continue
        mtime_ms = int(path.stat().st_mtime * 1000)
        yield Part(path.read_bytes(), modality, str(mtime_ms), path.stem)


def parts_from_manifest(manifest: Path) -> Iterator[Part]:
    """JSON lines: ``{"path"|"text", "event_time", "modality"?, "sample_id"?, "content_type"?, "record_id"?}``.

    Relative paths are taken from the manifest's folder. A bad line raises :class:`InputError` naming it.
    """
    base = manifest.parent
    try:
        lines = manifest.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise InputError(f"{manifest}: not UTF-8 text (byte {err.start}); a manifest is JSON lines") from None
    except OSError as err:
        raise InputError(f"cannot read {manifest}: {err.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{manifest}:{number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{where}: not JSON ({err.msg})") from None
        if not isinstance(item, dict):
            raise InputError(f"{where}: expected a JSON object")
        if "event_time" not in item:
            raise InputError(f"{where}: missing event_time")
        event_time = item["event_time"]
        if isinstance(event_time, bool) or not isinstance(event_time, (str, int)):
            raise InputError(f"{where}: event_time must be RFC 3339 text or integer epoch milliseconds")
        try:
            wire.parse_event_time(str(event_time))
        except ValueError as err:
            raise InputError(f"{where}: event_time {err}") from None
        for name in ("modality", "sample_id", "content_type", "record_id", "text", "path"):
            if name in item and not isinstance(item[name], str):
                raise InputError(f"{where}: {name} must be a string")
        if "text" in item:
            payload, modality = str(item["text"]).encode(), item.get("modality", "text")
        elif "path" in item:
            path = Path(item["path"])
            path = path if path.is_absolute() else base / path
            try:
                payload = path.read_bytes()
            except OSError as err:
                raise InputError(f"{where}: cannot read {path}: {err.strerror}") from None
            modality = item.get("modality") or EXTENSION_MODALITY.get(path.suffix.lower())
            if modality is None:
                raise InputError(f"{where}: cannot tell the modality of {path.name}; add 'modality'")
        else:
            raise InputError(f"{where}: needs 'path' or 'text'")
        if modality not in wire.MODALITIES:
            raise InputError(f"{where}: modality {modality!r} is not one of {', '.join(wire.MODALITIES)}")
        yield Part(
            payload=payload,
            modality=str(modality),
            event_time=str(item["event_time"]),
            sample_id=item.get("sample_id"),
            content_type=item.get("content_type"),
            record_id=item.get("record_id"),
        )


def produce_path(
    path: str | os.PathLike[str],
    topic: str,
    bootstrap: str,
    *,
    partitions: int = 1,
    timeout_s: float = 10.0,
) -> int:
    """Produce a folder of files or a JSONL manifest into ``topic``; return how many records were sent."""
    source = Path(path)
    if source.is_dir():
        parts: Iterable[Part] = parts_from_folder(source)
    elif source.is_file():
        parts = list(parts_from_manifest(source))  # a bad line fails before anything is sent
    else:
        raise InputError(f"{source} is neither a folder nor a manifest file")
    ensure_topic(bootstrap, topic, partitions, timeout_s)
    sent = 0
    with MultimodalProducer(bootstrap, timeout_s=timeout_s) as producer:
        for part in parts:
            producer.send(
                topic,
                part.payload,
                part.modality,
                event_time=part.event_time,
                sample_id=part.sample_id,
                content_type=part.content_type,
                record_id=part.record_id,
            )
            sent += 1
    return sent
