"""The API fuzzed from its own OpenAPI schema (schemathesis strategies driven by
Hypothesis): valid and invalid inputs, a bounded number of examples per route and
mode, against the session gateway with its real engines. Nothing a client sends
may get a 5xx."""

from __future__ import annotations

from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.support import GatewayProcess

EXAMPLES = 8  # per route and mode: 12 routes take bodies
MAX_TOKENS = 8  # generation is real (CPU engines): valid requests stay short
# Fields whose valid values would make a fuzzed request generate for minutes.
TOKEN_FIELDS = ("max_tokens", "max_completion_tokens", "min_tokens", "max_output_tokens")


def bounded(body: Any) -> Any:
    """Cap the lengths a valid body may ask for; invalid values stay as drawn."""
    if not isinstance(body, dict):
        return body
    for key in TOKEN_FIELDS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > MAX_TOKENS:
            body[key] = MAX_TOKENS
    # Every route's name for the limit (batch chat reads only max_tokens, Responses max_output_tokens).
    body.setdefault("max_tokens", MAX_TOKENS)
    body.setdefault("max_output_tokens", MAX_TOKENS)
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and n > 2:
        body["n"] = 2
    return body


def fuzz(operation: schemathesis.APIOperation, mode: GenerationMode, url: str) -> tuple[int, list[str]]:
    """Send EXAMPLES drawn requests of one route and mode; return how many went and the 5xx."""
    sent: list[int] = []
    server_errors: list[str] = []

    @settings(
        max_examples=EXAMPLES, deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def call(case: schemathesis.Case) -> None:
        if isinstance(case.body, dict):
            case.body = bounded(case.body)
        response = case.call(base_url=url, timeout=120)
        sent.append(response.status_code)
        if response.status_code >= 500:
            server_errors.append(f"{case.method} {case.formatted_path}: {response.status_code} {response.text[:300]}")

    try:
        call()
    except Unsatisfiable:  # a route without parameters has no invalid input to draw
        assert mode is GenerationMode.NEGATIVE
    return len(sent), server_errors


def test_no_request_gets_a_server_error(gateway: GatewayProcess) -> None:
    schema = schemathesis.openapi.from_url(f"{gateway.url}/openapi.json")
    server_errors: list[str] = []
    tried: dict[str, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            count, errors = fuzz(operation, mode, gateway.url)
            tried[f"{operation.method.upper()} {operation.path} ({mode.value})"] = count
            server_errors += errors
    print("fuzzed requests per route:", tried)
    assert len(tried) >= 8 and sum(tried.values()) > 100, tried
    assert not server_errors, "\n".join(server_errors[:10])
