"""The shapes of SafeCache's JSON bodies, as the handlers validate them and ``/openapi.json`` describes them."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field, ValidationError

from mmlake.cache.errors import BadRequestError


class ErrorBody(BaseModel):
    error: str = Field(description="One line saying what was wrong.")


class StoredBody(BaseModel):
    id: str | None = Field(description="The entry's id; null when it was not admitted.")
    lsh_key: str = Field(description="The table-0 LSH bucket of the embedding (hex).")
    admitted: bool
    refreshed: bool | None = Field(None, description="True when it refreshed a near-identical entry.")
    reason: str | None = Field(None, description="Why it was not admitted.")


class LookupQuery(BaseModel):
    """The body of ``POST /v1/kv/lookup``."""

    embedding: list[float] = Field(min_length=1, description="The query embedding (any scale; finite).")
    model_id: str = Field(min_length=1)
    min_similarity: float | None = Field(None, description="A stricter threshold than the server floor.")
    salt: str | None = Field(None, description="Partitions the tenant's entries further; must match the store's.")


class MissBody(BaseModel):
    error: str = Field(description="Always 'miss'.")
    best_similarity: float | None = Field(description="The best similarity among the candidates, if any.")
    reason: str


class SourceQuery(BaseModel):
    """The body of ``POST /v1/kv/invalidate``."""

    source: str = Field(min_length=1, description="The stream whose entries go.")


class InvalidatedBody(BaseModel):
    invalidated: int


class StatsBody(BaseModel, extra="allow"):
    entries: int
    bytes: dict[str, int]
    share: dict[str, int] | None = None


def errors(*codes: int) -> dict[int | str, dict[str, Any]]:
    text = {
        400: "Bad input",
        401: "No or unknown bearer token",
        403: "A token not allowed here",
        404: "Not found",
        408: "The body did not arrive in time",
        413: "Body or entry too large",
        429: "The tenant's bound on models is reached",
        503: "Too many request bytes held: retry",
    }
    return {code: {"model": ErrorBody, "description": text[code]} for code in codes}


SAFETENSORS = {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}
STORE_BODY = {
    "requestBody": {
        "required": True,
        "description": (
            "A safetensors file: a 1-D float32 tensor `embedding` and the KV tensors; `__metadata__` holds "
            "`model_id` (required), `ttl_s`, `source` and `salt` (optional)."
        ),
        "content": SAFETENSORS,
    }
}


def json_request(model: type[BaseModel]) -> dict[str, Any]:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": model.model_json_schema()}}}}


Query = TypeVar("Query", bound=BaseModel)


def validated(model: type[Query], body: Any, messages: dict[str, str]) -> Query:
    """``body`` as ``model`` (strict: no number from a string, no bool as a number); a
    :class:`BadRequestError` naming the first field that is wrong, in the words ``messages`` gives for it."""
    if not isinstance(body, dict):
        raise BadRequestError("body must be a JSON object")
    try:
        return model.model_validate(body, strict=True)
    except ValidationError as err:
        first = err.errors()[0]
        name = str(first["loc"][0]) if first.get("loc") else ""
        raise BadRequestError(messages.get(name) or f"bad {name or 'body'}: {first.get('msg')}") from None
