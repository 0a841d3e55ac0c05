"""A Python client of the SafeCache v1 HTTP API, for inference servers that do not embed the cache."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from mmlake.cache.codec import tensors_from_buffer
from mmlake.cache.core import Hit, Miss
from mmlake.cache.errors import CacheError, error_for
from mmlake.cache.tiers import Tensors

__all__ = ["SafeCacheClient", "tensors_from_buffer", "wait_for_server"]


def wait_for_server(base_url: str, *, timeout_s: float = 60.0, process: Any = None) -> None:
    """Return once the server at ``base_url`` answers ``/healthz`` with 200; a :class:`CacheError`
    after ``timeout_s``, or as soon as ``process`` (the server's ``Popen``, when one was started) has
    exited, with what it wrote to a piped stderr."""
    import time

    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{base_url}/healthz", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if process is not None and process.poll() is not None:
            err = process.stderr.read() if getattr(process, "stderr", None) else ""
            raise CacheError(f"the cache server exited with code {process.returncode} before answering: {err}")
        if time.monotonic() > deadline:
            raise CacheError(f"no answer from the cache server at {base_url} within {timeout_s:g}s")
        time.sleep(0.1)


class SafeCacheClient:
    """``SafeCacheClient("http://127.0.0.1:8470", token)``; the same operations as :class:`SafeCache`."""

    def __init__(self, base_url: str, token: str, *, timeout_s: float = 30.0) -> None:
        import httpx

        self._http = httpx.Client(
            base_url=base_url.rstrip("/"), timeout=timeout_s, headers={"Authorization": f"Bearer {token}"}
        )

    def _raise(self, response: Any) -> None:
        if response.status_code < 400:
            return
        try:
            message = response.json().get("error", response.text)
        except ValueError:
            message = response.text
        raise error_for(response.status_code)(f"{response.status_code}: {message}")

    def put(
        self,
        model_id: str,
        embedding: Any,
        tensors: Tensors,
        *,
        ttl_s: float | None = None,
        source: str | None = None,
        salt: str | None = None,
    ) -> dict[str, Any]:
        import torch
        from safetensors.torch import save

        metadata = {"model_id": model_id}
        if ttl_s is not None:
            metadata["ttl_s"] = str(ttl_s)
        if source is not None:
            metadata["source"] = source
        if salt is not None:
            metadata["salt"] = salt
        body = save(
            {
                **{k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                "embedding": torch.as_tensor(np.asarray(embedding, dtype=np.float32)),
            },
            metadata=metadata,
        )
        response = self._http.post("/v1/kv", content=body, headers={"Content-Type": "application/octet-stream"})
        self._raise(response)
        return dict(response.json())

    def lookup(
        self, model_id: str, embedding: Any, *, min_similarity: float | None = None, salt: str | None = None
    ) -> Hit | Miss:
        query: dict[str, Any] = {"model_id": model_id, "embedding": np.asarray(embedding, dtype=np.float32).tolist()}
        if min_similarity is not None:
            query["min_similarity"] = min_similarity
        if salt is not None:
            query["salt"] = salt
        with self._http.stream(
            "POST", "/v1/kv/lookup", content=json.dumps(query), headers={"Content-Type": "application/json"}
        ) as response:
            if response.status_code != 200:
                response.read()
                if response.status_code == 404:
                    body = response.json()
                    return Miss(body.get("best_similarity"), body.get("reason", "miss"))
                self._raise(response)
            size = int(response.headers.get("Content-Length", "0"))
            buffer = bytearray(size)
            got = 0
            for chunk in response.iter_raw():
                if got + len(chunk) > size:
                    raise CacheError("hit body is longer than its Content-Length")
                buffer[got : got + len(chunk)] = chunk
                got += len(chunk)
            if got != size:
                raise CacheError(f"hit body ended after {got} of {size} bytes")
            return Hit(
                response.headers["X-SafeCache-Id"],
                float(response.headers["X-SafeCache-Similarity"]),
                tensors_from_buffer(buffer),
            )

    def delete(self, entry_id: str) -> bool:
        response = self._http.delete(f"/v1/kv/{entry_id}")
        if response.status_code == 404:
            return False
        self._raise(response)
        return True

    def invalidate_source(self, source: str) -> int:
        """Drop this tenant's entries stored from ``source`` (a stream whose drift alarm is up)."""
        response = self._http.post(
            "/v1/kv/invalidate", content=json.dumps({"source": source}), headers={"Content-Type": "application/json"}
        )
        self._raise(response)
        return int(response.json()["invalidated"])

    def stats(self) -> dict[str, Any]:
        response = self._http.get("/v1/stats")
        self._raise(response)
        return dict(response.json())

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> SafeCacheClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
