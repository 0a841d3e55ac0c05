"""schemathesis against SafeCache's own ``/openapi.json``: generated requests to every route, checked for
no 5xx, documented status codes and content types, and responses that match their schemas."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from mmlake.cache import CacheSettings, SafeCache
from mmlake.cache.server import create_app
from tests.cache.helpers import TOKENS

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    response_headers_conformance,
]


# Made at import: building the app does no I/O and starts nothing (requests go through ASGI in process).
APP = create_app(SafeCache(CacheSettings(gpu_bytes=0, cpu_bytes=8 << 20, max_body_bytes=1 << 20)), TOKENS)
schema = schemathesis.openapi.from_asgi("/openapi.json", APP)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_generated_requests_get_no_5xx_and_documented_answers(case) -> None:
    for token in ("tok-alice", "tok-ops"):  # a tenant and an operator: every route for both
        case.call_and_validate(headers={"Authorization": f"Bearer {token}"}, checks=CHECKS)
