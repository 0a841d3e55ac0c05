"""What the command modules share: argument types, the options several commands take, and the
settings models built from them (flags over the environment, which is over the defaults)."""

from __future__ import annotations

import argparse
import re
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from mmlake.errors import InputError

if TYPE_CHECKING:
    from mmlake.ingest.settings import IngestSettings
    from mmlake.preprocessing.drift.settings import ReferenceRange
    from mmlake.preprocessing.settings import PreprocessSettings

    #: What ``add_subparsers`` returns: each command module adds its commands to it.
    Commands = argparse._SubParsersAction[argparse.ArgumentParser]


# -- argument types ---------------------------------------------------------------------------------


def _whole_number(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"expected a number {'>= 0' if least == 0 else '> 0'}, got {value}")
    return value


def non_negative_int(text: str) -> int:
    return _whole_number(text, 0)


def positive_int(text: str) -> int:
    return _whole_number(text, 1)


def port(text: str) -> int:
    value = positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1..65535, got {value}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def stream_name(text: str) -> str:
    """A stream name (``mmlake.lake.STREAM_NAME``): checked before anything is created."""
    from mmlake.lake import check_stream_name

    try:
        return check_stream_name(text)
    except InputError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


#: Kafka's rule for topic names: its legal characters, at most 249, not "." or "..".
_TOPIC = re.compile(r"[A-Za-z0-9._-]{1,249}")


def topic_name(text: str) -> str:
    """A Kafka topic name: checked before anything is created or sent."""
    if not _TOPIC.fullmatch(text) or text in (".", ".."):
        raise argparse.ArgumentTypeError(
            f"topic name {text[:80]!r} is not allowed: use letters, digits, '.', '_' and '-', at most 249, "
            "not '.' or '..'"
        )
    return text


def partitions(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated partition numbers, got {text!r}") from None
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"expected partition numbers >= 0, got {text!r}")
    return values


# -- options several commands take ----------------------------------------------------------------


def add_lake(p: argparse.ArgumentParser) -> None:
    p.add_argument("--lake", help="lake root, a path or object-store URI (default: $MMLAKE_LAKE or ./lake)")


def add_kafka(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $MMLAKE_KAFKA_BOOTSTRAP or 127.0.0.1:9092)")


def add_clip_weights(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--clip-weights",
        metavar="PATH",
        help="local open_clip checkpoint: CLIP for images and text (default: the trained "
        "EfficientNet-Lite0 for images, a seeded CLIP text tower)",
    )


def add_runtime(p: argparse.ArgumentParser) -> None:
    """The encoders and how ONNX Runtime runs them (the preprocessing settings a user sets per run)."""
    add_clip_weights(p)
    p.add_argument("--provider", choices=["auto", "cpu", "cuda"], help="ONNX Runtime execution provider")
    p.add_argument("--threads", type=positive_int, help="intra-op threads per session")
    p.add_argument("--batch-size", type=positive_int, help="inputs per encoder call")


def add_reference_range(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--reference-from",
        metavar="T1",
        help="fit the drift reference on the samples with T1 <= event time < T2 (RFC 3339 or epoch "
        "ms) instead of the stream's first ones; windows are scored from T2 on",
    )
    p.add_argument("--reference-to", metavar="T2", help="end of the reference range (exclusive)")
    p.add_argument(
        "--reference-first",
        action="store_true",
        help="back to the stream's first $MMLAKE_DRIFT_REFERENCE samples (a rebuild otherwise keeps the chosen range)",
    )


# -- settings from the options --------------------------------------------------------------------


def ingest_settings(args: argparse.Namespace, *, writes: bool) -> IngestSettings:
    """The lake and Kafka settings a command runs with (its flags over the environment). The lake is
    checked first; a command that ``writes`` has its folder made (or refused) before it starts."""
    from mmlake.ingest.settings import IngestSettings
    from mmlake.lake import check_lake

    settings = IngestSettings().with_overrides(
        lake=getattr(args, "lake", None),
        kafka_bootstrap=getattr(args, "bootstrap", None),
        allowed_lateness_s=getattr(args, "allowed_lateness", None),
        kafka_client=getattr(args, "kafka_client", None),
    )
    check_lake(settings.lake, create=writes)
    return settings


def preprocess_settings(args: argparse.Namespace) -> PreprocessSettings:
    """The preprocessing settings of :func:`add_runtime`'s options (those a command has)."""
    from mmlake.preprocessing.settings import PreprocessSettings

    return PreprocessSettings().with_overrides(
        clip_weights=args.clip_weights,
        provider=getattr(args, "provider", None),
        threads=getattr(args, "threads", None),
        batch_size=getattr(args, "batch_size", None),
    )


def reference_range(args: argparse.Namespace) -> ReferenceRange:
    """The drift reference :func:`add_reference_range`'s options ask for, checked (one line)."""
    from mmlake.preprocessing.drift.settings import ReferenceRange

    reference = ReferenceRange(start=args.reference_from, end=args.reference_to, first=args.reference_first)
    reference.bounds_us()
    return reference


def check_partitions(settings: IngestSettings, topic: str, wanted: list[int] | None) -> None:
    """``--partitions`` must name partitions the topic has: the engine's own check, made before Prefect
    starts or any table is made."""
    if not wanted:
        return
    from mmlake.ingest.producer import topic_partitions
    from mmlake.ingest.source import check_partitions as check

    have = topic_partitions(settings.kafka_bootstrap, topic, settings.kafka_timeout_s)
    if have:  # a missing topic is the topic check's to report
        check(topic, have, wanted)


# -- process ----------------------------------------------------------------------------------------


def cancel_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT (Ctrl-C) set: a run given it stops after its current commit."""
    cancel = threading.Event()

    def stop(*_: object) -> None:
        cancel.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return cancel


def read_text(path: str, what: str) -> str:
    """A UTF-8 text file a user named; one line when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise InputError(f"cannot read {what} {path}: {err.strerror}") from None
