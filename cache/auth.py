"""Who may call SafeCache: the tokens file, and the bearer token of a request checked against it.

A tenant's token names the tenant; an operator's token reads ``/metrics`` and nothing else. Tokens are
compared in constant time, against every known token (no early exit to time).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field

from mmlake.cache.errors import CacheError, ForbiddenError, UnauthorizedError


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
    bad = (
        f"tokens file {path} must be a non-empty JSON object of token -> tenant name (or -> "
        '{"tenant": name, "share": fraction} or {"operator": true})'
    )
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
        elif (
            isinstance(value, dict)
            and isinstance(value.get("tenant"), str)
            and value["tenant"]
            and set(value) <= {"tenant", "share"}
        ):
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


@dataclass(frozen=True)
class Caller:
    """Who sent a request: a tenant, or an operator (``tenant`` None)."""

    tenant: str | None
    operator: bool


def caller(tokens: Tokens, authorization: str) -> Caller:
    """The caller an ``Authorization`` header names; :class:`UnauthorizedError` without a known token."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise UnauthorizedError("missing bearer token")
    presented = token.strip().encode()
    found: Caller | None = None
    for known, tenant in tokens.tenants.items():  # compare with every token: no early exit to time
        if secrets.compare_digest(known.encode(), presented):
            found = Caller(tenant, False)
    for known in tokens.operators:
        if secrets.compare_digest(known.encode(), presented):
            found = Caller(None, True)
    if found is None:
        raise UnauthorizedError("unknown token")
    return found


def tenant_of(tokens: Tokens, authorization: str) -> str:
    """The tenant an ``Authorization`` header names; an operator's token is :class:`ForbiddenError`."""
    tenant = caller(tokens, authorization).tenant
    if tenant is None:
        raise ForbiddenError("an operator token reads /metrics only; use a tenant's token")
    return tenant
