"""Request bodies, read as a server that must stay up reads them: within a size limit (413), a time limit
(408) and a bound on the bytes all requests hold at once (503); JSON parsed with a depth limit, numbers
beyond float range as infinities (refused by whatever needs a finite number), NaN literals refused."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from mmlake.cache.errors import BadRequestError, BusyError, PayloadTooLargeError, RequestTimeoutError

if TYPE_CHECKING:
    from starlette.requests import Request

#: The most bytes a JSON request (lookup, invalidate) may have.
LOOKUP_BODY_LIMIT = 4 << 20


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


class BodyReader:
    """Reads request bodies within ``timeout_s`` each, holding at most ``max_inflight_bytes`` of all
    requests' bodies at once."""

    def __init__(self, max_inflight_bytes: int, timeout_s: float) -> None:
        self.inflight = _Inflight(max_inflight_bytes)
        self.timeout_s = timeout_s

    @asynccontextmanager
    async def body(self, request: Request, limit: int) -> AsyncIterator[bytes]:
        """The request body, read within ``limit`` bytes and the time limit, its bytes held against the
        in-flight bound until the handler is done with them."""
        declared = request.headers.get("content-length")
        expected = int(declared) if declared is not None and declared.isdigit() else None
        if expected is not None and expected > limit:
            raise PayloadTooLargeError(f"body of {expected} bytes exceeds the limit of {limit}")
        inflight = self.inflight
        held = expected or 0
        inflight.take(held)
        try:
            chunks, size = [], 0
            deadline = time.monotonic() + self.timeout_s
            stream = request.stream().__aiter__()
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestTimeoutError(f"the body did not arrive within {self.timeout_s:g}s")
                try:
                    chunk = await asyncio.wait_for(stream.__anext__(), timeout=left)
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise RequestTimeoutError(f"the body did not arrive within {self.timeout_s:g}s") from None
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


async def json_body(reader: BodyReader, request: Request, max_depth: int) -> Any:
    """A JSON request body (at most :data:`LOOKUP_BODY_LIMIT` bytes), parsed by :func:`parse_json`."""
    async with reader.body(request, LOOKUP_BODY_LIMIT) as body:
        return parse_json(body, max_depth)
