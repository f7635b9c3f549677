"""schemathesis against the server's own OpenAPI schema: whatever a client sends, never a 500."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, settings


@pytest.fixture
def live(serve):  # type: ignore[no-untyped-def]
    return serve(answer_cache=True, drift=True, max_tokens=8)


@pytest.fixture
def api_schema(live):  # type: ignore[no-untyped-def]
    """The schema the running server publishes."""
    return schemathesis.openapi.from_url(f"{live.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


@schema.parametrize()
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_server_error(case, live) -> None:  # type: ignore[no-untyped-def]
    if case.path == "/v1/chat/completions" and isinstance(case.body, dict) and "model" in case.body:
        case.body["model"] = live.model_id  # past the model check, into the engine
    response = case.call(base_url=live.url)
    assert response.status_code < 500, f"{case.method} {case.path} -> {response.status_code}: {response.text[:500]}"
