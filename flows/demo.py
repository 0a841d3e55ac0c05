"""``mmlake demo``: the pipeline on generated data, with the embedded broker and no configuration.

A generated multimodal data set (1,600 images with captions, audio clips, event times over three
hours; from sample 1,200 on, 176 samples after the drift reference ends, captions describe other
samples' images: a pairing shuffle) plus a few re-sent, late
and malformed records goes through the embedded broker into the lake; a second ingest run shows that
nothing is written twice. The raw rows go through the ONNX operators into the features table (the
trained EfficientNet-Lite0 for images, a seeded CLIP text tower for captions, unless
MMLAKE_PREPROCESS_CLIP_WEIGHTS is set); a backfill of one hour, run twice,
shows that a rerun changes nothing; drift detection raises its alarm on the image-text mutual
information; an inference server stores KV caches in SafeCache and looks them up, and the cache
warm-up flow sees the drift alarm and invalidates the stream's entries. A summary table ends it.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mmlake.settings import LakeSettings

#: Bad records the demo sends, one per dead-letter reason.
_MALFORMED: list[tuple[str, bytes, list[tuple[str, bytes]]]] = [
    ("no event time", b"caption", [("mm-modality", b"text")]),
    ("bad event time", b"caption", [("mm-event-time", b"yesterday"), ("mm-modality", b"text")]),
    ("unknown modality", b"frame", [("mm-event-time", b"1700000000000"), ("mm-modality", b"video")]),
    ("broken image", b"\x89PNG\r\n\x1a\nnot really", [("mm-event-time", b"1700000000000"), ("mm-modality", b"image")]),
    ("broken audio", b"RIFF\x00\x00\x00\x00WAVEjunk", [("mm-event-time", b"1700000000000"), ("mm-modality", b"audio")]),
    ("not UTF-8", b"\xff\xfe caption", [("mm-event-time", b"1700000000000"), ("mm-modality", b"text")]),
]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _progress(label: str, done: int, total: int) -> None:
    width = 30
    filled = int(width * done / max(total, 1))
    sys.stdout.write(f"\r  {label:<10} [{'#' * filled}{'.' * (width - filled)}] {done}/{total}")
    if done >= total:
        sys.stdout.write("\n")
    sys.stdout.flush()


def run_demo(lake: str = "./lake", samples: int = 1600, stream: str = "demo") -> int:
    """Run the demo and print its summary; returns the process exit code."""
    from mmlake.flows.ingest import ingest_stream
    from mmlake.ingest import EmbeddedBroker, IngestSettings, MultimodalProducer, ensure_topic, synth
    from mmlake.ingest.tables import dead_letter_reasons, outcome_counts
    from mmlake.lake import table_uri
    from mmlake.lineage import default_events_path

    # The lineage log is the lake's, shared with its other streams and kept across runs: count this run's.
    events_path = Path(default_events_path(lake))
    events_before = _lines(events_path)
    for name in (stream, "demo-pairs"):  # demo-pairs: the drift stream of earlier demo versions
        stream_dir = Path(table_uri(lake, name, "raw")).parent
        if stream_dir.exists():
            print(f"removing the previous demo stream at {stream_dir}")
            shutil.rmtree(stream_dir)
    shuffle_at = samples * 3 // 4
    with EmbeddedBroker() as broker:
        print(f"embedded broker up at {broker.bootstrap}")
        topic = "demo"
        ensure_topic(broker.bootstrap, topic, partitions=3)
        parts = list(synth.samples(samples, start_ms=START_MS, span_ms=SPAN_MS, seed=7, shuffle_pairs_after=shuffle_at))
        total = len(parts) + 3 + 3 + len(_MALFORMED)
        sent = 0
        with MultimodalProducer(broker.bootstrap) as producer:
            for part in parts:
                producer.send(
                    topic,
                    part.payload,
                    part.modality,
                    event_time=part.event_time_ms,
                    sample_id=part.sample_id,
                    content_type=part.content_type,
                )
                sent += 1
                if sent % 50 == 0:
                    _progress("produce", sent, total)
            for part in parts[-3:]:  # re-sent: duplicates
                producer.send(
                    topic, part.payload, part.modality, event_time=part.event_time_ms, sample_id=part.sample_id
                )
            for i in range(3):  # an hour behind the stream: late
                producer.send(
                    topic,
                    f"a late caption {i}".encode(),
                    "text",
                    event_time=START_MS + SPAN_MS - 3600_000 - i,
                    sample_id=f"late-{i}",
                )
            for i, (_, value, headers) in enumerate(_MALFORMED):
                producer.send_raw(topic, value, headers, key=f"bad-{i}".encode())
            sent = total
            _progress("produce", total, total)
        t0 = time.monotonic()
        settings = IngestSettings().with_overrides(lake=lake, kafka_bootstrap=broker.bootstrap)
        first = ingest_stream(topic=topic, stream=stream, settings=settings)
        seconds = time.monotonic() - t0
        second = ingest_stream(topic=topic, stream=stream, settings=settings)

    tables = settings.tables(stream)
    rows = outcome_counts(tables)
    reasons = dead_letter_reasons(tables)
    print()
    print(f"mmlake demo: {sent} records produced ({samples} samples), ingested in {seconds:.1f}s")
    print(
        f"  accepted={first.accepted} late={first.late} duplicates={first.duplicates} "
        f"dead_lettered={first.dead_lettered} watermark={first.watermark}"
    )
    print(f"  dead-letter reasons: {', '.join(reasons)}")
    print(
        f"  second run (exactly-once check): accepted={second.accepted} late={second.late} "
        f"dead_lettered={second.dead_lettered}"
    )
    from mmlake.flows.preprocess import backfill_features, preprocess_stream
    from mmlake.flows.stages import BackfillPlan

    t0 = time.monotonic()
    features = preprocess_stream(
        stream=stream, lake=settings, progress=lambda done, total: _progress("features", done, total or rows["raw"])
    ).summary
    print(f"  features ({time.monotonic() - t0:.1f}s, including generating the encoders on first use):")
    print(f"    {features.line()}")
    hour = ("2026-01-01T01:00:00Z", "2026-01-01T02:00:00Z")
    plan = BackfillPlan(start=hour[0], end=hour[1], stages="preprocess")
    forced = backfill_features(
        stream=stream,
        plan=plan.model_copy(update={"force": True}),
        lake=settings,
        progress=lambda done, total: _progress("backfill", done, total),
    )
    rerun = backfill_features(stream=stream, plan=plan, lake=settings)
    print(
        f"  backfill {hour[0]}..{hour[1]}: {forced.rows} rows recomputed; rerun rewrote {rerun.rows} "
        f"({rerun.skipped_ranges} day(s) already up to date)"
    )
    drift = _drift(settings, stream, samples, shuffle_at)
    # What each image shows, from its caption: only captions before the pairing shuffle tell the truth.
    captions = {
        p.sample_id: p.payload.decode()
        for p in parts
        if p.modality == "text" and int(p.sample_id.rsplit("-", 1)[1]) < shuffle_at
    }
    cache = _cache(settings, stream, captions, alarm=drift["raised"])

    events = _lines(events_path) - events_before
    summary = [
        (
            "raw / late / dlq rows",
            f"{rows['raw']} / {rows['late']} / {rows['dlq']}   ({Path(table_uri(lake, stream, 'raw')).parent})",
        ),
        ("duplicates / dead-lettered", f"{first.duplicates} / {first.dead_lettered} ({', '.join(reasons)})"),
        ("second ingest run", f"{second.accepted} new rows (exactly once)"),
        ("features", f"{features.rows} rows, {features.errors} errors" + _untrained(features.operators)),
        ("backfill rerun", f"{rerun.rows} rows rewritten ({rerun.skipped_ranges} day(s) up to date)"),
        ("drift alarms", drift["alarms"]),
        ("cache", cache["line"]),
        ("cache after the drift alarm", cache["after"]),
        ("lineage", f"{events} OpenLineage events in {events_path} (this run's)"),
        ("drift plot", drift["plot"] or "(artifact only: the lake is not a local path)"),
    ]
    print()
    print("summary")
    width = max(len(k) for k, _ in summary)
    for key, value in summary:
        print(f"  {key:<{width}}  {value}")
    print()
    print(f"try: mmlake lineage graph --lake {lake} --dataset {stream}/raw")
    print(f"     mmlake drift --lake {lake} --stream {stream}   (docs/drift.md)")
    print(f"     mmlake backfill --lake {lake} --stream {stream} --from {hour[0]} --to {hour[1]} --force")
    expected = {"raw": len(parts), "late": 3, "dlq": len(_MALFORMED)}
    ok = rows == expected and second.accepted == 0
    ok = ok and features.rows == rows["raw"] and features.errors == 0 and rerun.rows == 0 and forced.rows > 0
    ok = ok and drift["ok"] and cache["ok"]
    return 0 if ok else 1


def _untrained(operators: list[dict[str, Any]]) -> str:
    untrained = sorted(op["modality"] for op in operators if not op["trained"])
    return f" ({', '.join(untrained)}: UNTRAINED seeded encoders)" if untrained else ""


START_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z
SPAN_MS = 3 * 3600 * 1000


def _drift(lake: LakeSettings, stream: str, samples: int, shuffle_at: int) -> dict[str, Any]:
    """Drift at the default settings (a 1,024-sample reference, 128-sample windows every 16)."""
    from mmlake.flows.drift import drift_stream
    from mmlake.lake import format_us
    from mmlake.preprocessing.drift.settings import DriftSettings

    defaults = DriftSettings()
    t0 = time.monotonic()
    result = drift_stream(stream=stream, lake=lake)
    which = "the defaults" if not defaults.model_fields_set else "from MMLAKE_DRIFT_*"
    print(
        f"  drift (reference {defaults.reference} samples, windows of {defaults.window} every {defaults.step}: "
        f"{which}; {time.monotonic() - t0:.1f}s):"
    )
    print(f"    {result.line()}")
    raised = result.summary.alarms_raised
    shuffle_us = START_MS * 1000 + shuffle_at * SPAN_MS * 1000 // samples
    first: dict[str, dict[str, Any]] = {}
    for a in raised:
        first.setdefault(a["metric"], a)

    def hms(us: int) -> str:
        return format_us(us)[11:19]

    alarms = (
        "; ".join(
            f"{m} (window {hms(a['window_start'])}-{hms(a['window_end'])})"
            for m, a in sorted(first.items(), key=lambda kv: kv[1]["window_end"])
        )
        or "none"
    )
    alarms += f"   [captions shuffled from {hms(shuffle_us)} on]"
    # The first window ends one window after the reference; a stream too short to score a window past
    # the shuffle cannot be asked to alarm on it.
    scored_past_shuffle = samples >= max(defaults.reference, shuffle_at) + defaults.window
    ok = "mi.image-text" in first if scored_past_shuffle else True
    ok = ok and all(a["window_end"] >= shuffle_us for a in raised)
    return {"ok": ok, "alarms": alarms, "plot": result.plot, "raised": bool(raised)}


def _cache(lake: LakeSettings, stream: str, captions: dict[str, str], *, alarm: bool) -> dict[str, Any]:
    """An inference server's view: KV caches stored under the trained image encoder's embeddings of 12
    of the stream's images (squares and circles), looked up again (exactly; slightly perturbed; images
    of a shape no stored image shows; a stored shape in another colour; a random vector) at the
    server's threshold; then the cache warm-up flow, which sees the drift alarm and drops the stream's
    entries."""
    import threading

    import numpy as np
    import torch
    import uvicorn

    from mmlake.cache import CacheSettings, Hit, SafeCache, SafeCacheClient
    from mmlake.cache.lsh import at_cosine
    from mmlake.cache.server import create_app
    from mmlake.flows.cache import cache_warmup
    from mmlake.ingest.broker import free_port
    from mmlake.preprocessing.features import valid_rows

    ids, rows = valid_rows(lake.tables(stream), "image", 400)
    # What each image shows, from its caption ("a red circle on a dark background"; ``captions`` holds
    # those before the pairing shuffle only). Stored: images of two of the three shapes.
    shows = [tuple(captions.get(i, "").split()[1:3]) for i in ids]
    stored_at = [i for i, what in enumerate(shows) if len(what) == 2 and what[1] != "stripe"][:12]
    stored_kinds = {shows[i] for i in stored_at}
    later = range(max(stored_at) + 1, len(ids))
    other_shape = [rows[i] for i in later if len(shows[i]) == 2 and shows[i][1] == "stripe"][:4]
    other_colour = [
        rows[i] for i in later if len(shows[i]) == 2 and shows[i][1] != "stripe" and shows[i] not in stored_kinds
    ][:2]
    embeddings = rows[stored_at]
    token, model = "demo-token", "demo-vlm"
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(SafeCache(CacheSettings()), {token: "demo"}), host="127.0.0.1", port=port, log_level="warning"
        )
    )
    thread = threading.Thread(target=server.run, name="safecache", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    url = f"http://127.0.0.1:{port}"
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    threshold = CacheSettings().min_similarity
    try:
        with SafeCacheClient(url, token) as client:
            stored = {
                client.put(
                    model,
                    e,
                    {
                        "layer0.k": torch.randn(1, 4, 16, 32, generator=gen),
                        "layer0.v": torch.randn(1, 4, 16, 32, generator=gen),
                    },
                    source=stream,
                )["id"]
                for e in embeddings[:12]
            }
            queries = [("exact", e) for e in embeddings[:4]]
            queries += [("perturbed", at_cosine(e, 0.99, rng)) for e in embeddings[4:8]]
            queries += [("other shape", e) for e in other_shape]
            queries += [("other colour", e) for e in other_colour]
            queries += [
                ("random", np.asarray(rng.standard_normal(embeddings.shape[1]), dtype=np.float32)) for _ in range(2)
            ]
            results = [(kind, client.lookup(model, q)) for kind, q in queries]
            hits = [(k, r.similarity) for k, r in results if isinstance(r, Hit)]
            misses = [(k, r.best_similarity) for k, r in results if not isinstance(r, Hit)]
            print(
                f"  cache: {len(stored)} KV entries stored under image embeddings; "
                f"{len(queries)} lookups at the server's threshold {threshold}:"
            )
            for kind, r in results:
                if isinstance(r, Hit):
                    what = f"hit, similarity {r.similarity:.4f}"
                elif r.best_similarity is None:
                    what = "miss (no candidate in its LSH buckets)"
                else:
                    what = f"miss, best similarity {r.best_similarity:.4f}"
                print(f"    {kind:<12} {what}")
            print(
                "    (stored: squares and circles; other shape: stripes, which no stored image shows; other colour: "
                "a stored shape in a colour\n     it was not stored in. The ImageNet encoder tells shapes apart and "
                "barely sees hue, so a hit there reuses the KV of the same shape in another colour)"
            )
            warm = cache_warmup(stream=stream, lake=lake, cache_url=url, token=token)
            after = client.lookup(model, embeddings[0])
    finally:
        server.should_exit = True
        thread.join(10)
    print(
        f"  cache warm-up: {warm.keyed} feature rows keyed; drift alarm seen: {warm.drift_alarm}; "
        f"{warm.invalidated} entries of {stream} invalidated; the first lookup again: "
        f"{'hit' if isinstance(after, Hit) else 'miss'}"
    )
    sims = [s for _, s in hits]
    line = (
        f"{len(hits)} hits (similarity {min(sims):.4f}..{max(sims):.4f}), {len(misses)} misses "
        f"of {len(queries)} lookups"
        if sims
        else f"0 hits, {len(misses)} misses"
    )
    ok = all(isinstance(r, Hit) for k, r in results if k in ("exact", "perturbed")) and not any(
        isinstance(r, Hit) for k, r in results if k in ("random", "other shape")
    )
    if alarm:  # the warm-up must see the drift alarm and drop every entry of the stream
        ok = ok and warm.drift_alarm and warm.invalidated == len(stored) and not isinstance(after, Hit)
    else:
        ok = ok and not warm.drift_alarm and warm.invalidated == 0 and isinstance(after, Hit)
    return {
        "ok": ok,
        "line": line,
        "after": f"{warm.invalidated} entries invalidated; a repeated lookup misses"
        if not isinstance(after, Hit)
        else "entries still served (no drift alarm)",
    }
