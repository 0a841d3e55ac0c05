"""The SafeCache v1 HTTP API (FastAPI), as docs/cache.md describes it: the routes, over the cache and the
pieces of :mod:`mmlake.cache.auth` (who may call), :mod:`mmlake.cache.bodies` (request bodies within
bounds), :mod:`mmlake.cache.schemas` (the JSON shapes and ``/openapi.json``) and
:mod:`mmlake.cache.metrics` (``/metrics``).

Every route but ``/healthz`` and ``/openapi.json`` needs ``Authorization: Bearer <token>``; a tenant's
token names the tenant, and a tenant sees only its own entries and figures; an operator's token reads
``/metrics`` (per-tenant series) and nothing else. Every answer to a bad request is a 4xx with a
one-line ``{"error": ...}`` that leaves the cache unchanged: bodies are read with a size limit (413), a
time limit (408) and a bound on the bytes all requests hold at once (503 with ``Retry-After``); JSON
is parsed with a depth limit and numbers beyond float range become infinities, which are refused.
``/openapi.json`` describes every route, its bodies and its errors.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi import FastAPI, Request  # at module level: FastAPI resolves the route annotations from here
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from mmlake.cache.auth import Tokens, caller, load_tokens, tenant_of
from mmlake.cache.bodies import BodyReader, json_body
from mmlake.cache.codec import check_servable, parse_safetensors, safetensors_chunks
from mmlake.cache.core import Hit, SafeCache
from mmlake.cache.errors import BadRequestError, CacheError, ForbiddenError, status_of
from mmlake.cache.metrics import CacheMetrics
from mmlake.cache.schemas import (
    SAFETENSORS,
    STORE_BODY,
    InvalidatedBody,
    LookupQuery,
    MissBody,
    SourceQuery,
    StatsBody,
    StoredBody,
    errors,
    json_request,
    validated,
)

__all__ = ["Tokens", "create_app", "load_tokens", "serve"]

_LOOKUP_MESSAGES = {
    "embedding": "embedding must be a non-empty list of numbers",
    "model_id": "model_id is required",
    "min_similarity": "min_similarity must be a number",
    "salt": "salt must be a string",
}
_SOURCE_MESSAGES = {"source": "source is required"}


def error(status: int, message: str, **extra: Any) -> JSONResponse:
    """The one-line JSON error answer, with the header its status asks for."""
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    if status == 503:
        headers = {"Retry-After": "1"}
    if status == 408:
        headers = {"Connection": "close"}
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


@dataclass(frozen=True)
class Service:
    """What the handlers serve from (``app.state.service``): the cache, who may call, the request-body
    reader and the metrics."""

    cache: SafeCache
    tokens: Tokens
    reader: BodyReader
    exporter: CacheMetrics

    def tenant(self, request: Request) -> str:
        """The tenant of the request's bearer token (401 without a known one, 403 for an operator's)."""
        return tenant_of(self.tokens, request.headers.get("authorization", ""))


def _service(request: Request) -> Service:
    service: Service = request.app.state.service
    return service


async def _cache_error(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, CacheError)
    return error(status_of(err), str(err).splitlines()[0] if str(err) else type(err).__name__)


async def _invalid(request: Request, err: Exception) -> JSONResponse:
    assert isinstance(err, RequestValidationError)
    first = (err.errors() or [{}])[0]
    where = ".".join(str(x) for x in first.get("loc", ())) or "request"
    return error(400, f"bad {where}: {first.get('msg', 'invalid')}")


async def healthz() -> dict[str, str]:
    return {"status": "ok"}


async def store(request: Request) -> JSONResponse:
    """Store KV tensors under an embedding."""
    import torch
    from starlette.concurrency import run_in_threadpool

    service = _service(request)
    owner = service.tenant(request)
    async with service.reader.body(request, service.cache.settings.max_body_bytes) as body:
        tensors, metadata = parse_safetensors(body)
        embedding = tensors.pop("embedding", None)
        if embedding is None:
            raise BadRequestError("safetensors file has no 'embedding' tensor")
        if embedding.dtype != torch.float32 or embedding.dim() != 1:
            raise BadRequestError(f"'embedding' must be 1-D float32, got {embedding.dtype} {tuple(embedding.shape)}")
        check_servable(tensors)
        model_id = metadata.get("model_id")
        if not model_id:
            raise BadRequestError("__metadata__ has no model_id")
        ttl_s = None
        if "ttl_s" in metadata:
            try:
                ttl_s = float(metadata["ttl_s"])
            except ValueError:
                raise BadRequestError(f"ttl_s {metadata['ttl_s'][:40]!r} is not a number") from None
            if not np.isfinite(ttl_s):
                raise BadRequestError("ttl_s must be a finite number")
        result = await run_in_threadpool(
            service.cache.put,
            owner,
            model_id,
            embedding.numpy(),
            tensors,
            ttl_s=ttl_s,
            source=metadata.get("source"),
            salt=metadata.get("salt"),
        )
    payload: dict[str, Any] = {"id": result.id, "lsh_key": result.lsh_key, "admitted": result.admitted}
    if result.refreshed:
        payload["refreshed"] = True
    if result.reason:
        payload["reason"] = result.reason
    return JSONResponse(payload, status_code=201)


async def lookup(request: Request) -> Response:
    """Look up the KV tensors of the most similar entry at or above the threshold."""
    from starlette.concurrency import run_in_threadpool

    service = _service(request)
    owner = service.tenant(request)
    body = await json_body(service.reader, request, service.cache.settings.max_json_depth)
    query = validated(LookupQuery, body, _LOOKUP_MESSAGES)
    started = time.perf_counter()
    result = await run_in_threadpool(
        service.cache.lookup,
        owner,
        query.model_id,
        np.asarray(query.embedding, dtype=np.float64),
        min_similarity=query.min_similarity,
        salt=query.salt,
    )
    service.exporter.observe_lookup(time.perf_counter() - started)
    if isinstance(result, Hit):
        size, chunks = safetensors_chunks(result.tensors)

        async def stream() -> AsyncIterator[bytes]:
            for chunk in chunks:
                yield chunk

        return StreamingResponse(
            stream(),
            media_type="application/octet-stream",
            headers={
                "X-SafeCache-Id": result.id,
                "X-SafeCache-Similarity": f"{result.similarity:.6f}",
                "Content-Length": str(size),
            },
        )
    return JSONResponse(
        {"error": "miss", "best_similarity": result.best_similarity, "reason": result.reason}, status_code=404
    )


async def invalidate(request: Request) -> dict[str, int]:
    """Extension to v1: drop this tenant's entries stored with ``__metadata__.source == source``."""
    from starlette.concurrency import run_in_threadpool

    service = _service(request)
    owner = service.tenant(request)
    body = await json_body(service.reader, request, service.cache.settings.max_json_depth)
    query = validated(SourceQuery, body, _SOURCE_MESSAGES)
    return {"invalidated": await run_in_threadpool(service.cache.invalidate_source, owner, query.source)}


async def delete(entry_id: str, request: Request) -> Response:
    """Delete one of this tenant's entries (another tenant's id is not found)."""
    from starlette.concurrency import run_in_threadpool

    service = _service(request)
    if await run_in_threadpool(service.cache.delete, service.tenant(request), entry_id):
        return Response(status_code=204)
    return error(404, f"no entry {entry_id[:80]}")


async def stats(request: Request) -> dict[str, Any]:
    """This tenant's own figures: entries, bytes and share per tier, counters, models."""
    service = _service(request)
    return service.cache.stats(service.tenant(request))


async def metrics(request: Request) -> PlainTextResponse:
    """For operators: Prometheus text with per-tenant series (tenants get 403)."""
    service = _service(request)
    if not caller(service.tokens, request.headers.get("authorization", "")).operator:
        raise ForbiddenError("/metrics is for operator tokens (see the tokens file)")
    return PlainTextResponse(service.exporter.text(), media_type="text/plain; version=0.0.4")


_LOOKUP_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "A hit: a safetensors file of the KV tensors (no embedding).",
        "content": SAFETENSORS,
        "headers": {
            "X-SafeCache-Id": {"schema": {"type": "string"}},
            "X-SafeCache-Similarity": {"schema": {"type": "string"}},
        },
    },
    404: {"model": MissBody, "description": "A miss: nothing close enough."},
    **errors(400, 401, 403, 408, 413, 503),
}
_METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text, per-tenant series.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
    **errors(401, 403),
}


def create_app(cache: SafeCache, tokens: Tokens | Mapping[str, str]) -> FastAPI:
    """The FastAPI application serving ``cache`` to the tenants (and operators) of ``tokens``."""
    who = Tokens.of(tokens)
    cache.set_shares(who.shares, tenants=who.names())
    settings = cache.settings
    app = FastAPI(
        title="SafeCache",
        version="1",
        docs_url="/docs" if settings.docs else None,
        redoc_url="/redoc" if settings.docs else None,
        description="KV caches of transformer prefixes, keyed by embeddings, reused only for "
        "near-identical prompts. See docs/cache.md.",
    )
    app.state.service = Service(
        cache, who, BodyReader(settings.max_inflight_bytes, settings.body_timeout_s), CacheMetrics(cache)
    )
    app.add_exception_handler(CacheError, _cache_error)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.get("/healthz", responses={200: {"description": "The server answers."}})(healthz)
    app.post(
        "/v1/kv",
        status_code=201,
        response_model=StoredBody,
        openapi_extra=STORE_BODY,
        responses=errors(400, 401, 403, 408, 413, 429, 503),
    )(store)
    app.post("/v1/kv/lookup", openapi_extra=json_request(LookupQuery), responses=_LOOKUP_RESPONSES)(lookup)
    app.post(
        "/v1/kv/invalidate",
        response_model=InvalidatedBody,
        openapi_extra=json_request(SourceQuery),
        responses=errors(400, 401, 403, 408, 413, 503),
    )(invalidate)
    app.delete(
        "/v1/kv/{entry_id}", status_code=204, responses={204: {"description": "Deleted."}, **errors(400, 401, 403, 404)}
    )(delete)
    app.get("/v1/stats", response_model=StatsBody, responses=errors(401, 403))(stats)
    app.get("/metrics", responses=_METRICS_RESPONSES)(metrics)
    return app


def serve(
    port: int, tokens_path: str, *, host: str = "127.0.0.1", snapshot_dir: str | None = None, settings: Any = None
) -> None:
    """Run the server until interrupted; restore from and save to ``snapshot_dir`` when given."""
    import contextlib
    import os

    import uvicorn

    from mmlake.cache.settings import CacheSettings
    from mmlake.cache.snapshot import load_snapshot, save_snapshot

    tokens = load_tokens(tokens_path)
    if snapshot_dir and os.path.exists(snapshot_dir) and not os.path.isdir(snapshot_dir):
        raise CacheError(f"snapshot folder {snapshot_dir} is a file")
    cache = SafeCache(settings or CacheSettings(), shares=tokens.shares, tenants=tokens.names())
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
    print(f"SafeCache v1 listening on http://{host}:{port} for {len(tokens.names())} tenants", flush=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
