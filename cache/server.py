"""The SafeCache v1 HTTP API (FastAPI), as docs/cache.md describes it.

Every route but ``/healthz`` needs ``Authorization: Bearer <token>``; the token names the tenant, and a
tenant sees only its own entries. Bodies are read with a hard size limit (413 past it), and every bad
request gets a 4xx with a one-line ``{"error": ...}`` and leaves the cache unchanged.
"""

from __future__ import annotations

import json
import secrets
import struct
import time
from typing import Any

import numpy as np
from fastapi import Request  # at module level: FastAPI resolves the route annotations from here

from mmlake.cache.core import Hit, SafeCache
from mmlake.cache.errors import BadRequestError, CacheError, PayloadTooLargeError, UnauthorizedError

LOOKUP_BODY_LIMIT = 4 << 20
MAX_HEADER_BYTES = 16 << 20


def load_tokens(path: str) -> dict[str, str]:
    """A JSON object mapping bearer token -> tenant name; a one-line error when it is not one."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as err:
        raise CacheError(f"cannot read tokens file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise CacheError(f"tokens file {path} is not UTF-8 text (byte {err.start})") from None
    except json.JSONDecodeError as err:
        raise CacheError(f"tokens file {path} is not JSON: {err.msg}") from None
    if not isinstance(data, dict) or not data or not all(
        isinstance(k, str) and k and isinstance(v, str) and v for k, v in data.items()
    ):
        raise CacheError(f"tokens file {path} must be a non-empty JSON object of token -> tenant strings")
    return data


def parse_safetensors(body: bytes) -> tuple[dict[str, Any], dict[str, str]]:
    """Tensors and ``__metadata__`` of a safetensors file in memory; BadRequestError when malformed."""
    from safetensors.torch import load

    if len(body) < 8:
        raise BadRequestError("body is not a safetensors file: shorter than its 8-byte header length")
    (header_len,) = struct.unpack("<Q", body[:8])
    if header_len > min(MAX_HEADER_BYTES, len(body) - 8):
        raise BadRequestError("body is not a safetensors file: bad header length")
    try:
        header = json.loads(body[8 : 8 + header_len])
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise BadRequestError("body is not a safetensors file: header is not JSON") from None
    metadata = header.get("__metadata__") or {} if isinstance(header, dict) else None
    if not isinstance(metadata, dict):
        raise BadRequestError("safetensors __metadata__ must be an object")
    try:
        tensors = load(body)
    except Exception as err:  # safetensors raises its own error types for corrupt data
        raise BadRequestError(f"body is not a safetensors file: {str(err).splitlines()[0]}") from None
    return tensors, {str(k): str(v) for k, v in metadata.items()}


_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16", "int64": "I64",
    "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL",
}


def safetensors_chunks(tensors: dict[str, Any]) -> tuple[int, list[Any]]:
    """A safetensors file as (total size, chunks): the header, then each tensor's own memory.

    ``safetensors.torch.save`` copies every tensor into one new bytes object (about 20 ms for 16 MB
    here); the hit path instead streams the tensors' buffers as they are.
    """
    import torch

    header: dict[str, Any] = {}
    views: list[Any] = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        dtype = _DTYPES.get(str(t.dtype).removeprefix("torch."))
        if dtype is None:
            raise CacheError(f"tensor {name} has a dtype safetensors cannot carry: {t.dtype}")
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        views.append(memoryview(t.view(-1).view(torch.uint8).numpy()) if nbytes else b"")
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # keep the data 8-byte aligned, as the reference writer does
    head = struct.pack("<Q", len(raw)) + raw
    return len(head) + offset, [head, *views]


def create_app(cache: SafeCache, tokens: dict[str, str]) -> Any:
    """The FastAPI application serving ``cache`` to the tenants in ``tokens``."""
    import torch
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
    from prometheus_client import CollectorRegistry, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from starlette.concurrency import run_in_threadpool

    app = FastAPI(title="SafeCache", version="1")
    registry = CollectorRegistry()
    latency = Histogram(
        "safecache_lookup_seconds", "Lookup latency inside the server", registry=registry,
        buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0),
    )

    class _CacheCollector:
        def collect(self) -> Any:
            totals = cache.counters()
            for name, value in totals.items():
                family = CounterMetricFamily(f"safecache_{name}", f"SafeCache {name.replace('_', ' ')}")
                family.add_metric([], value)
                yield family
            stats = cache.stats()
            tier_bytes = GaugeMetricFamily("safecache_bytes", "Bytes of KV tensors per tier", labels=["tier"])
            for tier, value in stats["bytes"].items():
                tier_bytes.add_metric([tier], value)
            yield tier_bytes
            entries = GaugeMetricFamily("safecache_entries", "Live entries")
            entries.add_metric([], stats["entries"])
            yield entries

    registry.register(_CacheCollector())  # type: ignore[arg-type]

    def error(status: int, message: str, **extra: Any) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)

    def tenant_of(request: Request) -> str:
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token:
            raise UnauthorizedError("missing bearer token")
        for known, tenant in tokens.items():
            if secrets.compare_digest(known.encode(), token.strip().encode()):
                return tenant
        raise UnauthorizedError("unknown token")

    async def read_body(request: Request, limit: int) -> bytes:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise PayloadTooLargeError(f"body of {declared} bytes exceeds the limit of {limit}")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
        return b"".join(chunks)

    @app.exception_handler(CacheError)
    async def _cache_error(request: Request, err: CacheError) -> JSONResponse:
        if isinstance(err, UnauthorizedError):
            return error(401, str(err))
        if isinstance(err, PayloadTooLargeError):
            return error(413, str(err))
        return error(400, str(err))

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/kv", status_code=201)
    async def store(request: Request) -> JSONResponse:
        tenant = tenant_of(request)
        body = await read_body(request, cache.settings.max_body_bytes)
        tensors, metadata = parse_safetensors(body)
        embedding = tensors.pop("embedding", None)
        if embedding is None:
            raise BadRequestError("safetensors file has no 'embedding' tensor")
        if embedding.dtype != torch.float32 or embedding.dim() != 1:
            raise BadRequestError(f"'embedding' must be 1-D float32, got {embedding.dtype} {tuple(embedding.shape)}")
        model_id = metadata.get("model_id")
        if not model_id:
            raise BadRequestError("__metadata__ has no model_id")
        ttl_s = None
        if "ttl_s" in metadata:
            try:
                ttl_s = float(metadata["ttl_s"])
            except ValueError:
                raise BadRequestError(f"ttl_s {metadata['ttl_s']!r} is not a number") from None
        result = await run_in_threadpool(cache.put, tenant, model_id, embedding.numpy(), tensors, ttl_s=ttl_s,
                                         source=metadata.get("source"))
        payload: dict[str, Any] = {"id": result.id, "lsh_key": result.lsh_key, "admitted": result.admitted}
        if result.refreshed:
            payload["refreshed"] = True
        if result.reason:
            payload["reason"] = result.reason
        return JSONResponse(payload, status_code=201)

    @app.post("/v1/kv/lookup")
    async def lookup(request: Request) -> Response:
        tenant = tenant_of(request)
        body = await read_body(request, LOOKUP_BODY_LIMIT)
        try:
            query = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequestError("body is not JSON") from None
        if not isinstance(query, dict):
            raise BadRequestError("body must be a JSON object")
        embedding, model_id = query.get("embedding"), query.get("model_id")
        if not isinstance(model_id, str) or not model_id:
            raise BadRequestError("model_id is required")
        if not isinstance(embedding, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in embedding
        ):
            raise BadRequestError("embedding must be a list of numbers")
        min_similarity = query.get("min_similarity")
        if min_similarity is not None and (not isinstance(min_similarity, int | float) or isinstance(min_similarity, bool)):
            raise BadRequestError("min_similarity must be a number")
        started = time.perf_counter()
        result = await run_in_threadpool(
            cache.lookup, tenant, model_id, np.asarray(embedding, dtype=np.float32), min_similarity=min_similarity
        )
        latency.observe(time.perf_counter() - started)
        if isinstance(result, Hit):
            size, chunks = safetensors_chunks(result.tensors)

            async def stream() -> Any:
                for chunk in chunks:
                    yield chunk

            return StreamingResponse(stream(), media_type="application/octet-stream", headers={
                "X-SafeCache-Id": result.id, "X-SafeCache-Similarity": f"{result.similarity:.6f}",
                "Content-Length": str(size)})
        return JSONResponse({"error": "miss", "best_similarity": result.best_similarity, "reason": result.reason},
                            status_code=404)

    @app.post("/v1/kv/invalidate")
    async def invalidate(request: Request) -> dict[str, int]:
        """Extension to v1: drop this tenant's entries stored with ``__metadata__.source == source``."""
        tenant = tenant_of(request)
        try:
            query = json.loads(await read_body(request, LOOKUP_BODY_LIMIT))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise BadRequestError("body is not JSON") from None
        source = query.get("source") if isinstance(query, dict) else None
        if not isinstance(source, str) or not source:
            raise BadRequestError("source is required")
        return {"invalidated": await run_in_threadpool(cache.invalidate_source, tenant, source)}

    @app.delete("/v1/kv/{entry_id}")
    async def delete(entry_id: str, request: Request) -> Response:
        tenant = tenant_of(request)
        if await run_in_threadpool(cache.delete, tenant, entry_id):
            return Response(status_code=204)
        return error(404, f"no entry {entry_id}")

    @app.get("/v1/stats")
    async def stats(request: Request) -> dict[str, Any]:
        return cache.stats(tenant_of(request))

    @app.get("/metrics")
    async def metrics(request: Request) -> PlainTextResponse:
        tenant_of(request)
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    return app


def serve(port: int, tokens_path: str, *, host: str = "127.0.0.1", snapshot_dir: str | None = None,
          settings: Any = None) -> None:
    """Run the server until interrupted; restore from and save to ``snapshot_dir`` when given."""
    import asyncio
    import contextlib

    import uvicorn

    from mmlake.cache.settings import CacheSettings
    from mmlake.cache.snapshot import load_snapshot, save_snapshot

    tokens = load_tokens(tokens_path)
    cache = SafeCache(settings or CacheSettings())
    if snapshot_dir:
        restored = load_snapshot(cache, snapshot_dir)
        print(f"restored {restored} live entries from {snapshot_dir}", flush=True)
    app = create_app(cache, tokens)

    @contextlib.asynccontextmanager
    async def lifespan(_: Any) -> Any:
        async def sweeper() -> None:
            while True:
                await asyncio.sleep(5)
                cache.sweep()

        task = asyncio.create_task(sweeper())
        yield
        task.cancel()
        if snapshot_dir:
            saved = save_snapshot(cache, snapshot_dir)
            print(f"saved {saved} live entries to {snapshot_dir}", flush=True)

    app.router.lifespan_context = lifespan
    print(f"SafeCache v1 listening on http://{host}:{port} for {len(set(tokens.values()))} tenants", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
