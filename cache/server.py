"""The SafeCache v1 HTTP API (FastAPI), as docs/cache.md describes it.

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
import json
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from fastapi import FastAPI, Request  # at module level: FastAPI resolves the route annotations from here
from fastapi.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from pydantic import BaseModel, Field

from mmlake.cache.codec import check_servable, parse_safetensors, safetensors_chunks
from mmlake.cache.core import Hit, SafeCache
from mmlake.cache.errors import (
    BadRequestError,
    BusyError,
    CacheError,
    ForbiddenError,
    PayloadTooLargeError,
    RequestTimeoutError,
    UnauthorizedError,
    status_of,
)

LOOKUP_BODY_LIMIT = 4 << 20


@dataclass(frozen=True)
class Tokens:
    """Who may call: bearer token -> tenant, the operators' tokens, and tenants' shares of the budget."""

    tenants: dict[str, str]
    operators: frozenset[str] = frozenset()
    shares: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, tokens: Tokens | Mapping[str, str]) -> Tokens:
        return tokens if isinstance(tokens, Tokens) else cls(dict(tokens))

    def names(self) -> list[str]:
        return sorted(set(self.tenants.values()))


def load_tokens(path: str) -> Tokens:
    """The tokens file: a JSON object mapping each bearer token to its tenant's name, or to an object
    ``{"tenant": NAME, "share": 0.25}`` (a fraction of every tier; tenants without one split what is
    left equally) or ``{"operator": true}`` (reads /metrics only). One line when it is not that."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as err:
        raise CacheError(f"cannot read tokens file {path}: {err.strerror}") from None
    except UnicodeDecodeError as err:
        raise CacheError(f"tokens file {path} is not UTF-8 text (byte {err.start})") from None
    except (json.JSONDecodeError, RecursionError) as err:
        raise CacheError(f"tokens file {path} is not JSON: {getattr(err, 'msg', err)}") from None
    bad = f"tokens file {path} must be a non-empty JSON object of token -> tenant name (or -> " \
          '{"tenant": name, "share": fraction} or {"operator": true})'
    if not isinstance(data, dict) or not data:
        raise CacheError(bad)
    tenants: dict[str, str] = {}
    operators: set[str] = set()
    shares: dict[str, float] = {}
    for token, value in data.items():
        if not isinstance(token, str) or not token:
            raise CacheError(bad)
        if isinstance(value, str) and value:
            tenants[token] = value
        elif isinstance(value, dict) and value.get("operator") is True and set(value) == {"operator"}:
            operators.add(token)
        elif isinstance(value, dict) and isinstance(value.get("tenant"), str) and value["tenant"] \
                and set(value) <= {"tenant", "share"}:
            tenants[token] = value["tenant"]
            if "share" in value:
                share = value["share"]
                if isinstance(share, bool) or not isinstance(share, int | float) or not 0 < share <= 1:
                    raise CacheError(f"tokens file {path}: share of {value['tenant']!r} must be in (0, 1]")
                shares[value["tenant"]] = float(share)
        else:
            raise CacheError(bad)
    if sum(shares.values()) > 1 + 1e-9:
        raise CacheError(f"tokens file {path}: the shares add up to {sum(shares.values()):g}, more than 1")
    if not tenants:
        raise CacheError(f"tokens file {path} names no tenant")
    return Tokens(tenants, frozenset(operators), shares)


# -- request parsing ----------------------------------------------------------------------------

def _json_depth(body: bytes) -> int:
    """The deepest nesting of arrays and objects in a JSON text (strings skipped)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in body:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            deepest = max(deepest, depth)
        elif byte in (0x5D, 0x7D):
            depth -= 1
    return deepest


def _reject_constant(name: str) -> float:
    raise BadRequestError(f"{name} is not a JSON number")


def parse_json(body: bytes, max_depth: int) -> Any:
    """A JSON request body: at most ``max_depth`` deep; integers and floats beyond float range become
    infinities (refused by whatever needs a finite number); NaN and Infinity literals are refused."""
    if _json_depth(body) > max_depth:
        raise BadRequestError(f"JSON body nested deeper than {max_depth}")
    try:
        return json.loads(body, parse_int=float, parse_constant=_reject_constant)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError, ValueError) as err:
        if isinstance(err, BadRequestError):
            raise
        raise BadRequestError("body is not JSON") from None


class _Inflight:
    """Request-body bytes held by all requests at once, bounded (the server stays within its memory)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def take(self, n: int) -> None:
        if self.held + n > self.limit:
            raise BusyError(f"the server holds {self.held} bytes of requests already (limit {self.limit}); retry")
        self.held += n

    def give(self, n: int) -> None:
        self.held = max(0, self.held - n)


# -- the OpenAPI description --------------------------------------------------------------------

class ErrorBody(BaseModel):
    error: str = Field(description="One line saying what was wrong.")


class StoredBody(BaseModel):
    id: str | None = Field(description="The entry's id; null when it was not admitted.")
    lsh_key: str = Field(description="The table-0 LSH bucket of the embedding (hex).")
    admitted: bool
    refreshed: bool | None = Field(None, description="True when it refreshed a near-identical entry.")
    reason: str | None = Field(None, description="Why it was not admitted.")


class LookupQuery(BaseModel):
    embedding: list[float] = Field(min_length=1, description="The query embedding (any scale; finite).")
    model_id: str = Field(min_length=1)
    min_similarity: float | None = Field(None, description="A stricter threshold than the server floor.")
    salt: str | None = Field(None, description="Partitions the tenant's entries further; must match the store's.")


class MissBody(BaseModel):
    error: str = Field(description="Always 'miss'.")
    best_similarity: float | None = Field(description="The best similarity among the candidates, if any.")
    reason: str


class SourceQuery(BaseModel):
    source: str = Field(min_length=1, description="The stream whose entries go.")


class InvalidatedBody(BaseModel):
    invalidated: int


class StatsBody(BaseModel, extra="allow"):
    entries: int
    bytes: dict[str, int]
    share: dict[str, int] | None = None


def _errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {400: "Bad input", 401: "No or unknown bearer token", 403: "A token not allowed here",
            404: "Not found", 408: "The body did not arrive in time", 413: "Body or entry too large",
            429: "The tenant's bound on models is reached", 503: "Too many request bytes held: retry"}
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


_SAFETENSORS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
_STORE_BODY = {"requestBody": {"required": True, "description": (
    "A safetensors file: a 1-D float32 tensor `embedding` and the KV tensors; `__metadata__` holds "
    "`model_id` (required), `ttl_s`, `source` and `salt` (optional)."), "content": _SAFETENSORS}}


def _json_body(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


def create_app(cache: SafeCache, tokens: Tokens | Mapping[str, str]) -> Any:
    """The FastAPI application serving ``cache`` to the tenants (and operators) of ``tokens``."""
    import torch
    from fastapi.exceptions import RequestValidationError
    from prometheus_client import CollectorRegistry, Histogram, generate_latest
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
    from starlette.concurrency import run_in_threadpool

    who = Tokens.of(tokens)
    cache.set_shares(who.shares, tenants=who.names())
    settings = cache.settings
    inflight = _Inflight(settings.max_inflight_bytes)
    app = FastAPI(title="SafeCache", version="1", docs_url="/docs" if settings.docs else None,
                  redoc_url="/redoc" if settings.docs else None,
                  description="KV caches of transformer prefixes, keyed by embeddings, reused only for "
                              "near-identical prompts. See docs/cache.md.")
    registry = CollectorRegistry()
    latency = Histogram(
        "safecache_lookup_seconds", "Lookup latency inside the server", registry=registry,
        buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0),
    )

    class _CacheCollector:
        def collect(self) -> Any:
            per_tenant = cache.tenant_stats()
            for name in SafeCache.COUNTERS:
                family = CounterMetricFamily(f"safecache_{name}", f"SafeCache {name.replace('_', ' ')}",
                                             labels=["tenant"])
                for tenant, stats in per_tenant.items():
                    family.add_metric([tenant], stats[name])
                yield family
            tier_bytes = GaugeMetricFamily("safecache_bytes", "Bytes of KV tensors per tier and tenant",
                                           labels=["tier", "tenant"])
            entries = GaugeMetricFamily("safecache_entries", "Live entries per tenant", labels=["tenant"])
            for tenant, stats in per_tenant.items():
                for tier, value in stats["bytes"].items():
                    tier_bytes.add_metric([tier, tenant], value)
                entries.add_metric([tenant], stats["entries"])
            yield tier_bytes
            yield entries
            overhead = cache.index_overhead()
            index = GaugeMetricFamily("safecache_index_bytes", "Estimated bytes of the LSH and vector indexes")
            index.add_metric([], overhead["bytes"])
            yield index

    registry.register(_CacheCollector())  # type: ignore[arg-type]

    def error(status: int, message: str, **extra: Any) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if status == 503:
            headers = {"Retry-After": "1"}
        if status == 408:
            headers = {"Connection": "close"}
        return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)

    def caller(request: Request) -> tuple[str | None, bool]:
        """(tenant, is operator) of the request's bearer token; 401 without a known one."""
        auth = request.headers.get("authorization", "")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise UnauthorizedError("missing bearer token")
        presented = token.strip().encode()
        found: tuple[str | None, bool] | None = None
        for known, tenant in who.tenants.items():  # compare with every token: no early exit to time
            if secrets.compare_digest(known.encode(), presented):
                found = (tenant, False)
        for known in who.operators:
            if secrets.compare_digest(known.encode(), presented):
                found = (None, True)
        if found is None:
            raise UnauthorizedError("unknown token")
        return found

    def tenant_of(request: Request) -> str:
        tenant, _ = caller(request)
        if tenant is None:
            raise ForbiddenError("an operator token reads /metrics only; use a tenant's token")
        return tenant

    @asynccontextmanager
    async def body_of(request: Request, limit: int) -> AsyncIterator[bytes]:
        """The request body, read within ``limit`` bytes and ``body_timeout_s``, its bytes held against
        the server's in-flight bound until the handler is done with them."""
        declared = request.headers.get("content-length")
        expected = int(declared) if declared is not None and declared.isdigit() else None
        if expected is not None and expected > limit:
            raise PayloadTooLargeError(f"body of {expected} bytes exceeds the limit of {limit}")
        held = expected or 0
        inflight.take(held)
        try:
            chunks, size = [], 0
            deadline = time.monotonic() + settings.body_timeout_s
            stream = request.stream().__aiter__()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeoutError(f"the body did not arrive within {settings.body_timeout_s:g}s")
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), timeout=left)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise RequestTimeoutError(f"the body did not arrive within {settings.body_timeout_s:g}s") from None
                size += len(chunk)
                if size > limit:
                    raise PayloadTooLargeError(f"body exceeds the limit of {limit} bytes")
                if size > held:
                    inflight.take(size - held)
                    held = size
                chunks.append(chunk)
            if expected is not None and size != expected:
                raise BadRequestError(f"body of {size} bytes, Content-Length said {expected}")
            yield b"".join(chunks)
        finally:
            inflight.give(held)

    @app.exception_handler(CacheError)
    async def _cache_error(request: Request, err: CacheError) -> JSONResponse:
        return error(status_of(err), str(err).splitlines()[0] if str(err) else type(err).__name__)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        first = (err.errors() or [{}])[0]
        where = ".".join(str(x) for x in first.get("loc", ())) or "request"
        return error(400, f"bad {where}: {first.get('msg', 'invalid')}")

    @app.get("/healthz", responses={200: {"description": "The server answers."}})
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/kv", status_code=201, response_model=StoredBody, openapi_extra=_STORE_BODY,
              responses=_errors(400, 401, 403, 408, 413, 429, 503))
    async def store(request: Request) -> JSONResponse:
        """Store KV tensors under an embedding."""
        tenant = tenant_of(request)
        async with body_of(request, settings.max_body_bytes) as body:
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
            result = await run_in_threadpool(cache.put, tenant, model_id, embedding.numpy(), tensors, ttl_s=ttl_s,
                                             source=metadata.get("source"), salt=metadata.get("salt"))
        payload: dict[str, Any] = {"id": result.id, "lsh_key": result.lsh_key, "admitted": result.admitted}
        if result.refreshed:
            payload["refreshed"] = True
        if result.reason:
            payload["reason"] = result.reason
        return JSONResponse(payload, status_code=201)

    @app.post("/v1/kv/lookup", openapi_extra=_json_body(LookupQuery), responses={
        200: {"description": "A hit: a safetensors file of the KV tensors (no embedding).", "content": _SAFETENSORS,
              "headers": {"X-SafeCache-Id": {"schema": {"type": "string"}},
                          "X-SafeCache-Similarity": {"schema": {"type": "string"}}}},
        404: {"model": MissBody, "description": "A miss: nothing close enough."},
        **_errors(400, 401, 403, 408, 413, 503)})
    async def lookup(request: Request) -> Response:
        """Look up the KV tensors of the most similar entry at or above the threshold."""
        tenant = tenant_of(request)
        async with body_of(request, LOOKUP_BODY_LIMIT) as body:
            query = parse_json(body, settings.max_json_depth)
        if not isinstance(query, dict):
            raise BadRequestError("body must be a JSON object")
        embedding, model_id, salt = query.get("embedding"), query.get("model_id"), query.get("salt")
        if not isinstance(model_id, str) or not model_id:
            raise BadRequestError("model_id is required")
        if salt is not None and not isinstance(salt, str):
            raise BadRequestError("salt must be a string")
        if not isinstance(embedding, list) or not all(
            isinstance(x, int | float) and not isinstance(x, bool) for x in embedding
        ):
            raise BadRequestError("embedding must be a list of numbers")
        min_similarity = query.get("min_similarity")
        if min_similarity is not None and (not isinstance(min_similarity, int | float) or isinstance(min_similarity, bool)):
            raise BadRequestError("min_similarity must be a number")
        started = time.perf_counter()
        result = await run_in_threadpool(cache.lookup, tenant, model_id, np.asarray(embedding, dtype=np.float64),
                                         min_similarity=min_similarity, salt=salt)
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

    @app.post("/v1/kv/invalidate", response_model=InvalidatedBody, openapi_extra=_json_body(SourceQuery),
              responses=_errors(400, 401, 403, 408, 413, 503))
    async def invalidate(request: Request) -> dict[str, int]:
        """Extension to v1: drop this tenant's entries stored with ``__metadata__.source == source``."""
        tenant = tenant_of(request)
        async with body_of(request, LOOKUP_BODY_LIMIT) as body:
            query = parse_json(body, settings.max_json_depth)
        source = query.get("source") if isinstance(query, dict) else None
        if not isinstance(source, str) or not source:
            raise BadRequestError("source is required")
        return {"invalidated": await run_in_threadpool(cache.invalidate_source, tenant, source)}

    @app.delete("/v1/kv/{entry_id}", status_code=204, responses={
        204: {"description": "Deleted."}, **_errors(400, 401, 403, 404)})
    async def delete(entry_id: str, request: Request) -> Response:
        """Delete one of this tenant's entries (another tenant's id is not found)."""
        tenant = tenant_of(request)
        if await run_in_threadpool(cache.delete, tenant, entry_id):
            return Response(status_code=204)
        return error(404, f"no entry {entry_id[:80]}")

    @app.get("/v1/stats", response_model=StatsBody, responses=_errors(401, 403))
    async def stats(request: Request) -> dict[str, Any]:
        """This tenant's own figures: entries, bytes and share per tier, counters, models."""
        return cache.stats(tenant_of(request))

    @app.get("/metrics", responses={
        200: {"description": "Prometheus text, per-tenant series.", "content": {"text/plain": {"schema": {"type": "string"}}}},
        **_errors(401, 403)})
    async def metrics(request: Request) -> PlainTextResponse:
        """For operators: Prometheus text with per-tenant series (tenants get 403)."""
        _, operator = caller(request)
        if not operator:
            raise ForbiddenError("/metrics is for operator tokens (see the tokens file)")
        return PlainTextResponse(generate_latest(registry).decode(), media_type="text/plain; version=0.0.4")

    return app


def serve(port: int, tokens_path: str, *, host: str = "127.0.0.1", snapshot_dir: str | None = None,
          settings: Any = None) -> None:
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
