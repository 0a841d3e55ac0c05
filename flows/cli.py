"""The ``mmlake`` command line. Every failure a user can cause ends in one line on stderr and a
non-zero exit code (2 for bad arguments, 1 for everything else)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mmlake.errors import InputError, MmlakeError


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


def _partitions(text: str) -> list[int]:
    try:
        values = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated partition numbers, got {text!r}") from None
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError(f"expected partition numbers >= 0, got {text!r}")
    return values


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def _port(text: str) -> int:
    value = _positive_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 1..65535, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {value}")
    return value


#: Commands that write to the lake: its folder is made (or refused) before they start.
_WRITERS = {"ingest", "compact", "serve", "preprocess", "drift", "backfill"}


def _settings(args: argparse.Namespace) -> Any:
    """The settings a command runs with (flags over the environment); the lake is checked first."""
    from mmlake.ingest.settings import IngestSettings
    from mmlake.lake import check_lake

    settings = IngestSettings().with_overrides(
        lake=getattr(args, "lake", None),
        kafka_bootstrap=getattr(args, "bootstrap", None),
        allowed_lateness_s=getattr(args, "allowed_lateness", None),
        kafka_client=getattr(args, "kafka_client", None),
    )
    check_lake(settings.lake, create=getattr(args, "command", None) in _WRITERS)
    return settings


def _check_partitions(settings: Any, topic: str, partitions: list[int] | None) -> None:
    """``--partitions`` must name partitions the topic has: checked before Prefect starts or any table is made."""
    if not partitions:
        return
    from mmlake.ingest.producer import topic_partitions

    have = topic_partitions(settings.kafka_bootstrap, topic, settings.kafka_timeout_s)
    missing = sorted(set(partitions) - set(have))
    if have and missing:
        raise InputError(f"topic {topic!r} has no partition {', '.join(map(str, missing))} "
                         f"(it has {len(have)}: 0..{len(have) - 1})")


def _cancel_on_signals() -> threading.Event:
    """An event that SIGTERM and SIGINT (Ctrl-C) set: a run given it stops after its current commit."""
    cancel = threading.Event()

    def stop(*_: object) -> None:
        cancel.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return cancel


def cmd_broker(args: argparse.Namespace) -> int:
    from mmlake.ingest.broker import EmbeddedBroker

    broker = EmbeddedBroker(port=args.port, storage=args.storage).start()
    kept = "in memory" if broker.storage.startswith("memory://") else f"log in {broker.storage}"
    print(f"embedded Kafka broker (Tansu, {kept}) at {broker.bootstrap}; Ctrl-C stops it", flush=True)
    def terminate(*_: object) -> None:
        raise KeyboardInterrupt  # leave wait() and stop the broker in the finally below

    signal.signal(signal.SIGTERM, terminate)
    try:
        broker.wait()
    except KeyboardInterrupt:
        pass
    finally:
        broker.stop()
    return 0


def cmd_produce(args: argparse.Namespace) -> int:
    from mmlake.ingest.producer import produce_path

    settings = _settings(args)
    sent = produce_path(
        args.path, args.topic, settings.kafka_bootstrap, partitions=args.partitions,
        timeout_s=settings.kafka_timeout_s,
    )
    print(f"produced {sent} records to {args.topic} at {settings.kafka_bootstrap}")
    return 0


def cmd_ingest(args: argparse.Namespace) -> int:
    from mmlake.ingest.errors import TopicNotFoundError
    from mmlake.ingest.producer import topic_exists

    settings = _settings(args)
    # Fail fast, before Prefect spends seconds starting, when the broker or the topic is not there.
    if not topic_exists(settings.kafka_bootstrap, args.topic, settings.kafka_timeout_s):
        raise TopicNotFoundError(f"topic {args.topic!r} does not exist at {settings.kafka_bootstrap}")
    _check_partitions(settings, args.topic, args.partitions)
    from mmlake.flows.ingest import ingest_stream

    cancel = _cancel_on_signals()
    result = ingest_stream(
        topic=args.topic,
        stream=args.stream,
        lake=settings.lake,
        bootstrap=settings.kafka_bootstrap,
        partitions=args.partitions,
        follow=args.follow,
        max_records=args.max_records,
        allowed_lateness_s=settings.allowed_lateness_s,
        cancel=cancel,
        kafka_client=settings.kafka_client,
    )
    from mmlake.ingest.engine import IngestSummary

    offsets = {int(p): span for p, span in result["offsets"].items()}
    fields = {k: v for k, v in result.items() if k in IngestSummary.__dataclass_fields__}
    print(IngestSummary(**{**fields, "offsets": offsets}).line())
    return 0


def cmd_compact(args: argparse.Namespace) -> int:
    from mmlake.ingest.maintenance import compact

    settings = _settings(args)
    report = compact(
        settings.lake, args.stream, retention_hours=args.retention_hours,
        storage_options=dict(settings.storage_options),
    )
    if not report:
        raise MmlakeError(f"stream {args.stream!r} has no tables under {settings.lake}")
    for table, stats in report.items():
        print(
            f"{args.stream}/{table}: z-ordered by event_time, {stats['files_removed']} files -> "
            f"{stats['files_added']}, vacuumed {stats['vacuumed']}, version {stats['version']}"
        )
    return 0


def cmd_read(args: argparse.Namespace) -> int:
    from mmlake.ingest.reader import count_rows, read_stream

    settings = _settings(args)
    shown = 0
    cols = ["event_time", "modality", "sample_id", "record_id", "kafka_partition", "kafka_offset"]
    options = dict(settings.storage_options)
    batches = read_stream(settings.lake, args.stream, args.start, args.end, table=args.table, columns=cols,
                          storage_options=options)
    try:
        for batch in batches:
            for row in batch.to_pylist():
                if shown >= args.limit:
                    more = count_rows(settings.lake, args.stream, args.start, args.end, table=args.table,
                                      storage_options=options) - shown
                    print(f"... {more} more row{'s' if more != 1 else ''} (--limit N shows more)")
                    return 0
                print(f"{row['event_time'].isoformat()}  {row['modality']:<5}  {row['sample_id']}  "
                      f"{row['record_id'][:12]}  p{row['kafka_partition']}@{row['kafka_offset']}")
                shown += 1
    finally:
        # Release the Delta scan before the interpreter exits: Arrow data of a deltalake scan still
        # alive at exit can abort the process while delta-rs's runtime shuts down.
        batches.close()
        del batches
        import gc

        gc.collect()
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from mmlake.flows.deployments import serve_pipeline
    from mmlake.flows.stages import parse_pipeline_stages

    settings = _settings(args)
    stages = ",".join(parse_pipeline_stages(args.stages))
    if "ingest" in stages:
        _check_partitions(settings, args.topic, args.partitions)
    token = None
    if args.cache_token_file:
        token = _read_text(args.cache_token_file, "token file").strip()
    serve_pipeline(
        topic=args.topic, stream=args.stream, lake=settings.lake, bootstrap=settings.kafka_bootstrap,
        partitions=args.partitions, stages=stages, interval_s=args.interval,
        cache_interval_s=args.cache_interval, cache_url=args.cache_url, token=token,
    )
    return 0


def _read_text(path: str, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"{what} {path} is not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise InputError(f"cannot read {what} {path}: {err.strerror}") from None


def cmd_cache_serve(args: argparse.Namespace) -> int:
    from mmlake.cache.server import serve

    if args.snapshot_dir and Path(args.snapshot_dir).exists() and not Path(args.snapshot_dir).is_dir():
        raise InputError(f"--snapshot-dir {args.snapshot_dir} is a file, not a folder")
    serve(args.port, args.tokens, host=args.host, snapshot_dir=args.snapshot_dir)
    return 0


def cmd_lineage_graph(args: argparse.Namespace) -> int:
    from mmlake.lineage.query import format_graph, lineage_graph, load_events

    settings = _settings(args)
    events = load_events(settings.lake, dict(settings.storage_options))
    for line in format_graph(lineage_graph(events, args.dataset, args.depth)):
        print(line)
    return 0


def cmd_lineage_explain(args: argparse.Namespace) -> int:
    from mmlake.lineage.query import explain_record, format_explain

    settings = _settings(args)
    info = explain_record(settings.lake, args.stream, args.record_id, dict(settings.storage_options))
    for line in format_explain(info):
        print(line)
    return 0


def _preprocess_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {"lake": _settings(args).lake, "clip_weights": args.clip_weights, "provider": args.provider,
            "threads": args.threads, "batch_size": args.batch_size}


def _registry(args: argparse.Namespace) -> Any:
    """The operator registry the preprocessing commands use (with ``--clip-weights`` where given)."""
    from mmlake.preprocessing.registry import load_registry
    from mmlake.preprocessing.settings import PreprocessSettings

    return load_registry(PreprocessSettings().with_overrides(clip_weights=args.clip_weights))


def _precheck(args: argparse.Namespace, operators: list[str]) -> None:
    """Fail fast, before Prefect spends seconds starting: the stream's raw table and the operators."""
    from mmlake.errors import InputError

    tables = _settings(args).tables(args.stream)
    if not tables.exists("raw"):
        raise InputError(f"stream {args.stream!r} has no raw table at {tables.uri('raw')} (ingest it first)")
    registry = _registry(args)
    for ref in operators:
        registry.operator(ref)


def cmd_preprocess(args: argparse.Namespace) -> int:
    from mmlake.flows.preprocess import preprocess_stream
    from mmlake.preprocessing.drift.report import result_line
    from mmlake.preprocessing.features import PreprocessSummary

    _precheck(args, args.operator or [])
    result = preprocess_stream(stream=args.stream, operators=args.operator or None, max_rows=args.max_rows,
                               then_drift=args.then_drift, cancel=_cancel_on_signals(),
                               **_preprocess_overrides(args))
    drift = result.pop("drift", None)
    print(PreprocessSummary(**result).line())
    if drift is not None:
        print(result_line(drift))
    return 0


def cmd_drift(args: argparse.Namespace) -> int:
    from mmlake.errors import InputError
    from mmlake.flows.drift import drift_stream, reference_choice
    from mmlake.preprocessing.drift.report import result_line

    reference_choice(args.reference_from, args.reference_to)  # one line before a flow run starts
    settings = _settings(args)
    tables = settings.tables(args.stream)
    if not tables.exists("features"):  # before a flow run starts (and its API server with it)
        raise InputError(f"stream {args.stream!r} has no features table at {tables.uri('features')} "
                         "(run `mmlake preprocess` first)")
    result = drift_stream(stream=args.stream, lake=settings.lake, rebuild=args.rebuild,
                          max_samples=args.max_samples, window=args.window, step=args.step,
                          reference=args.reference, reference_from=args.reference_from,
                          reference_to=args.reference_to, reference_first=args.reference_first)
    print(result_line(result))
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    from mmlake.flows.backfill import backfill, check_range
    from mmlake.flows.stages import parse_backfill_stages
    from mmlake.preprocessing.drift.report import result_line

    from mmlake.flows.drift import reference_choice

    check_range(args.start, args.end)
    reference_choice(args.reference_from, args.reference_to)
    stages = parse_backfill_stages(args.stages)
    if "preprocess" in stages:
        _precheck(args, [args.operator] if args.operator else [])
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(f"backfill {args.stream} {args.start}..{args.end}"), BarColumn(), MofNCompleteColumn(),
                  TimeRemainingColumn(), transient=False, disable=not sys.stderr.isatty() and not args.progress,
                  console=None) as bar:
        job = bar.add_task("rows", total=None)
        result = backfill(stream=args.stream, start=args.start, end=args.end, stages=",".join(stages),
                          operator=args.operator, force=args.force, reference_from=args.reference_from,
                          reference_to=args.reference_to, reference_first=args.reference_first,
                          progress=lambda done, total: bar.update(job, completed=done, total=total),
                          **_preprocess_overrides(args))
    if "preprocess" in stages:
        if result["days"] and result["skipped_days"] == len(result["days"]):
            print(f"{args.stream}: {args.start}..{args.end} is already up to date ({result['skipped_days']} days "
                  "checked, nothing rewritten)")
        else:
            print(f"{args.stream}: {result['rows']} feature rows rewritten over {len(result['days'])} day(s) "
                  f"({result['skipped_days']} already up to date)")
    drift = result.get("drift")
    if drift is not None:
        print(result_line(drift) if "samples" in drift else f"{args.stream}: drift: {drift['status']}")
    return 0


def cmd_ops_list(args: argparse.Namespace) -> int:

    registry = _registry(args)
    defaults = set(registry.defaults.values())
    print("operators (what features rows name):")
    for ref, op in sorted(registry.operators.items()):
        mark = "*" if ref in defaults else " "
        trained = "trained" if op.trained else "UNTRAINED (seeded)"
        print(f" {mark} {ref:28} {op.modality:6} sha256 {op.sha256[:16]}  {trained}")
        for m in op.models:
            where = registry.model_path(m)
            state = "generated on first use" if m.generated and not where.exists() else str(where)
            print(f"     {m.ref:32} opset {m.opset}  sha256 {str(registry.expected_sha256(m))[:16]}  {state}")
    print("(* default for its modality)")
    return 0


def cmd_ops_verify(args: argparse.Namespace) -> int:
    from mmlake.preprocessing.verify import verify

    registry = _registry(args)
    results = verify(registry, regenerate=not args.no_regenerate)
    for result in results:
        print(result.text())
    bad = [r.ref for r in results if not r.ok]
    if bad:
        raise MmlakeError(f"{len(bad)} of {len(results)} operator models failed verification: {', '.join(bad)}")
    return 0


def cmd_ops_build(args: argparse.Namespace) -> int:
    """Generate the encoder models into the cache now (replacing any cached copy)."""
    from mmlake.preprocessing.build import build_generated

    for ref, path in build_generated(_registry(args)):
        print(f"{ref}: {path}")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from mmlake.flows.demo import run_demo

    return run_demo(lake=args.lake, samples=args.samples)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mmlake", description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def kafka(p: argparse.ArgumentParser) -> None:
        p.add_argument("--bootstrap", help="Kafka bootstrap servers (default: $MMLAKE_KAFKA_BOOTSTRAP or 127.0.0.1:9092)")

    def lake(p: argparse.ArgumentParser) -> None:
        p.add_argument("--lake", help="lake root, a path or object-store URI (default: $MMLAKE_LAKE or ./lake)")

    def reference_range(p: argparse.ArgumentParser) -> None:
        p.add_argument("--reference-from", metavar="T1",
                       help="fit the drift reference on the samples with T1 <= event time < T2 (RFC 3339 or epoch "
                            "ms) instead of the stream's first ones; windows are scored from T2 on")
        p.add_argument("--reference-to", metavar="T2", help="end of the reference range (exclusive)")
        p.add_argument("--reference-first", action="store_true",
                       help="back to the stream's first $MMLAKE_DRIFT_REFERENCE samples (a rebuild otherwise keeps "
                            "the chosen range)")

    p = sub.add_parser("broker", help="run the embedded Kafka-compatible broker (in memory, or durable on S3)")
    p.add_argument("--port", type=_port, default=9092)
    p.add_argument("--storage", default="memory://",
                   help="memory:// (default: a restart forgets the topics) or s3://BUCKET/ (the log survives "
                        "restarts; AWS_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION as usual)")
    p.set_defaults(func=cmd_broker)

    p = sub.add_parser("produce", help="produce a folder of files or a JSONL manifest into a topic")
    p.add_argument("path", help="a folder (.png .jpg .wav .txt) or a JSONL manifest")
    p.add_argument("--topic", required=True)
    p.add_argument("--partitions", type=_positive_int, default=1, help="partitions if the topic is created")
    kafka(p)
    p.set_defaults(func=cmd_produce)

    p = sub.add_parser("ingest", help="ingest a topic into a stream's Delta tables (exactly once)")
    p.add_argument("--topic", required=True)
    p.add_argument("--stream", required=True)
    lake(p)
    kafka(p)
    p.add_argument("--follow", action="store_true", help="keep going until stopped (default: what is there now)")
    p.add_argument("--max-records", type=_positive_int, help="stop after reading this many records")
    p.add_argument("--partitions", type=_partitions, help="only these partitions, e.g. 0,2 (default: all)")
    p.add_argument("--allowed-lateness", type=_non_negative_float, metavar="SECONDS")
    p.add_argument("--kafka-client", choices=["kafka-python", "confluent-kafka"],
                   help="the client to read with (default: $MMLAKE_KAFKA_CLIENT or confluent-kafka)")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("compact", help="z-order a stream's tables by event time, checkpoint and vacuum")
    p.add_argument("--stream", required=True)
    lake(p)
    p.add_argument("--retention-hours", type=_non_negative_float, default=168.0)
    p.set_defaults(func=cmd_compact)

    p = sub.add_parser("read", help="print a stream's rows in event-time order")
    p.add_argument("--stream", required=True)
    lake(p)
    p.add_argument("--from", dest="start", help="first event time (RFC 3339 or epoch ms), inclusive")
    p.add_argument("--to", dest="end", help="last event time, exclusive")
    p.add_argument("--table", choices=["raw", "late"], default="raw")
    p.add_argument("--limit", type=_positive_int, default=20, help="rows to print (default 20)")
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("serve", help="serve the stream's flows on their schedules (pipeline, cache warm-up)")
    p.add_argument("--topic", required=True)
    p.add_argument("--stream", required=True)
    p.add_argument("--interval", type=_positive_int, default=60, metavar="SECONDS",
                   help="the pipeline (ingest, then preprocess, then drift) every SECONDS (default 60)")
    p.add_argument("--stages", default="ingest,preprocess,drift",
                   help="the pipeline's stages (default all three; 'ingest' serves ingest alone)")
    p.add_argument("--partitions", type=_partitions,
                   help="only these Kafka partitions, e.g. 0,2: several serve processes can split a topic")
    p.add_argument("--cache-interval", type=_non_negative_int, default=300, metavar="SECONDS",
                   help="the cache warm-up every SECONDS (default 300; 0: not served)")
    p.add_argument("--cache-url", help="the SafeCache server whose entries a drift alarm invalidates")
    p.add_argument("--cache-token-file", help="a file holding the bearer token for --cache-url")
    lake(p)
    kafka(p)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("cache", help="SafeCache, the KV cache for inference servers")
    cache_sub = p.add_subparsers(dest="cache_command", required=True, metavar="COMMAND")
    p = cache_sub.add_parser("serve", help="serve the SafeCache v1 HTTP API")
    p.add_argument("--port", type=_port, default=8470)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--tokens", required=True, help="JSON file mapping each bearer token to its tenant")
    p.add_argument("--snapshot-dir", help="restore live entries from here on start, save them here on stop")
    p.set_defaults(func=cmd_cache_serve)

    p = sub.add_parser("lineage", help="query the lineage events kept in the lake (<lake>/_lineage/)")
    lineage_sub = p.add_subparsers(dest="lineage_command", required=True, metavar="COMMAND")
    p = lineage_sub.add_parser("graph", help="jobs and datasets upstream and downstream of a dataset")
    p.add_argument("--dataset", required=True, help="a dataset name, or a unique suffix of one (demo/raw)")
    p.add_argument("--depth", type=_positive_int, default=2)
    lake(p)
    p.set_defaults(func=cmd_lineage_graph)
    p = lineage_sub.add_parser("explain", help="provenance of one record, from Kafka to drift windows")
    p.add_argument("--stream", required=True)
    p.add_argument("--record-id", required=True)
    lake(p)
    p.set_defaults(func=cmd_lineage_explain)

    def runtime(p: argparse.ArgumentParser) -> None:
        p.add_argument("--clip-weights", metavar="PATH", help="local open_clip checkpoint: CLIP for images and text (default: the trained EfficientNet-Lite0 for images, a seeded CLIP text tower)")
        p.add_argument("--provider", choices=["auto", "cpu", "cuda"], help="ONNX Runtime execution provider")
        p.add_argument("--threads", type=_positive_int, help="intra-op threads per session")
        p.add_argument("--batch-size", type=_positive_int, help="inputs per encoder call")

    p = sub.add_parser("preprocess", help="compute the features rows a stream is missing (ONNX operators)")
    p.add_argument("--stream", required=True)
    lake(p)
    p.add_argument("--operator", action="append", metavar="NAME@VERSION",
                   help="use this operator for its modality (repeatable; default: the registry's defaults)")
    p.add_argument("--max-rows", type=_positive_int, help="stop after this many rows")
    p.add_argument("--then-drift", action="store_true", help="run the drift flow on the stream afterwards")
    runtime(p)
    p.set_defaults(func=cmd_preprocess)

    p = sub.add_parser("drift", help="score drift windows over a stream's new features")
    p.add_argument("--stream", required=True)
    lake(p)
    p.add_argument("--rebuild", action="store_true",
                   help="start over: fit a new reference and rescore every window (after a backfill or a change "
                        "of operator or settings)")
    p.add_argument("--max-samples", type=_positive_int, help="take at most this many new samples in this run")
    p.add_argument("--window", type=_positive_int, help="samples per window (default 128; $MMLAKE_DRIFT_WINDOW)")
    p.add_argument("--step", type=_positive_int, help="samples between windows (default 16)")
    p.add_argument("--reference", type=_positive_int, help="samples in the reference window (default 1024)")
    reference_range(p)
    p.set_defaults(func=cmd_drift)

    p = sub.add_parser("backfill", help="re-run an event-time range through the stages (features, then drift)")
    p.add_argument("--stream", required=True)
    p.add_argument("--from", dest="start", required=True, help="first event time (RFC 3339 or epoch ms), inclusive")
    p.add_argument("--to", dest="end", required=True, help="last event time, exclusive")
    p.add_argument("--operator", metavar="NAME@VERSION", help="only this operator's modality, with this operator")
    p.add_argument("--force", action="store_true", help="rewrite even a range that is already up to date")
    p.add_argument("--stages", default="preprocess,drift",
                   help="what to re-run for the range, in order: preprocess, drift (default both; drift is "
                        "rescored only when the range's features changed)")
    p.add_argument("--progress", action="store_true", help="draw the progress bar even when stderr is not a terminal")
    reference_range(p)
    lake(p)
    runtime(p)
    p.set_defaults(func=cmd_backfill)

    p = sub.add_parser("ops", help="the ONNX operator registry")
    ops_sub = p.add_subparsers(dest="ops_command", required=True, metavar="COMMAND")
    p = ops_sub.add_parser("list", help="operators, their models and hashes")
    p.add_argument("--clip-weights", metavar="PATH")
    p.set_defaults(func=cmd_ops_list)
    p = ops_sub.add_parser("verify", help="check every model against its recorded hash and a regeneration")
    p.add_argument("--clip-weights", metavar="PATH")
    p.add_argument("--no-regenerate", action="store_true", help="only check the files' hashes")
    p.set_defaults(func=cmd_ops_verify)
    p = ops_sub.add_parser("build", help="generate the encoder models into the cache now")
    p.add_argument("--clip-weights", metavar="PATH")
    p.set_defaults(func=cmd_ops_build)

    p = sub.add_parser("demo", help="the whole pipeline on generated data with the embedded broker")
    p.add_argument("--lake", default="./lake")
    p.add_argument("--samples", type=_positive_int, default=1600)
    p.set_defaults(func=cmd_demo)
    return parser


def _one_line(err: BaseException) -> str:
    """An error as one line: a settings source that cannot be parsed, a store that cannot be reached,
    a path that cannot be written, ..."""
    from pydantic_settings import SettingsError

    if isinstance(err, SettingsError):
        return f"bad setting: {str(err).splitlines()[0]} (check the MMLAKE_... environment variables)"
    import re

    plain = re.sub(r"\x1b\[[0-9;]*m", "", str(err)).replace("↳", ";")  # delta-rs colours its error chains
    text = " ".join(plain.split()) or type(err).__name__
    if len(text) > 300:
        text = text[:300] + "..."
    return text if isinstance(err, (OSError,)) else f"{type(err).__name__}: {text}"


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``mmlake`` console script."""
    from pydantic import ValidationError

    # No telemetry from the ephemeral Prefect server unless the user asks for it.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MmlakeError as err:
        print(f"mmlake: error: {err}", file=sys.stderr)
        return 1
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "settings"
        print(f"mmlake: error: bad setting {where}: {first.get('msg')}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as err:  # noqa: BLE001 - the one-line promise holds for what nobody foresaw, too
        if os.environ.get("MMLAKE_DEBUG"):
            raise
        print(f"mmlake: error: {_one_line(err)} (MMLAKE_DEBUG=1 shows the traceback)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
