"""Bad requests get a 4xx in OpenAI's error envelope and the server keeps serving.
What vLLM refuses is refused by vLLM's own serving layer, with its message and
type (test_parity compares them with `vllm serve`'s); what is specgate's own
(routing, unknown routes) has OpenAI's types."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL

MESSAGES = [{"role": "user", "content": "Hi"}]


def assert_error(reply: httpx.Response, status: int, code: str | None = None) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert isinstance(error["message"], str) and error["message"]
    assert isinstance(error["type"], str) and error["type"]
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return dict(error)


BAD_BODIES: dict[str, dict[str, Any]] = {
    "missing messages": {"model": MODEL},
    "empty messages": {"model": MODEL, "messages": []},
    "messages not a list": {"model": MODEL, "messages": "hello"},
    "max_tokens wrong type": {"model": MODEL, "messages": MESSAGES, "max_tokens": "many"},
    "negative max_tokens": {"model": MODEL, "messages": MESSAGES, "max_tokens": -5},
    "temperature out of range": {"model": MODEL, "messages": MESSAGES, "temperature": 7},
    "greedy with n>1": {"model": MODEL, "messages": MESSAGES, "n": 2, "temperature": 0},
    "min_p on a speculating engine": {"model": f"{MODEL}:ngram", "messages": MESSAGES, "min_p": 0.1},
    "max_tokens beyond context": {"model": MODEL, "messages": MESSAGES, "max_tokens": 100000},
    "stream_options without stream": {"model": MODEL, "messages": MESSAGES, "stream_options": {"include_usage": True}},
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_chat_request(http: httpx.Client, body: dict[str, Any]) -> None:
    assert_error(http.post("/v1/chat/completions", json=body), 400)


def test_engine_rejection_is_400_streamed_or_not(http: httpx.Client) -> None:
    body = {"model": f"{MODEL}:ngram", "messages": MESSAGES, "min_p": 0.2}
    error = assert_error(http.post("/v1/chat/completions", json=body), 400)
    assert "min_p" in error["message"]
    # Streamed, vLLM refuses it in the stream (as `vllm serve` does): one error event, then [DONE].
    reply = http.post("/v1/chat/completions", json={**body, "stream": True})
    assert reply.status_code == 200
    events = [e for e in reply.text.split("\n\n") if e]
    assert len(events) == 2 and events[1] == "data: [DONE]"
    streamed = json.loads(events[0].removeprefix("data: "))["error"]
    assert streamed["code"] == 400 and "min_p" in streamed["message"]


def test_min_p_is_fine_on_baseline(http: httpx.Client) -> None:
    body = {"model": f"{MODEL}:none", "messages": MESSAGES, "min_p": 0.1, "max_tokens": 4}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


@pytest.mark.parametrize("extra", [{"min_p": 0.2}, {"logit_bias": {"905": 3}}], ids=["min_p", "logit_bias"])
@pytest.mark.parametrize("model", [MODEL, f"{MODEL}:auto"])
def test_unsupported_sampling_goes_to_the_baseline_unless_named(
    http: httpx.Client, extra: dict[str, Any], model: str
) -> None:
    """The default method (ngram) and auto cannot serve it: the baseline does, and says why."""
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, **extra}
    reply = http.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    record = reply.json()["specgate"]
    assert record["method"] == "none"
    if model == MODEL:  # the default method is ngram: the gateway moved it
        assert record["route"]["reason"] == "unsupported_by_speculation"
    else:  # auto may have chosen none itself; if it chose ngram, the gateway moved it
        assert record["route"]["policy"] == "auto"
    details = reply.json()["usage"]["completion_tokens_details"]
    assert details == {"accepted_prediction_tokens": None, "rejected_prediction_tokens": None}
    named = http.post("/v1/chat/completions", json={**body, "model": f"{MODEL}:ngram"})
    assert named.status_code == 400
    header = http.post("/v1/chat/completions", json=body, headers={"X-Spec-Method": "ngram"})
    assert header.status_code == 400


def test_unknown_fields_are_ignored_as_vllm_does(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 2, "tools_please": True}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_malformed_json(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/chat/completions",
        content=b'{"model": "smollm2", "messages": [',
        headers={"content-type": "application/json"},
    )
    assert_error(reply, 400)


def test_prompt_too_long_names_token_counts(http: httpx.Client) -> None:
    long_text = "word " * 5000
    body = {"model": f"{MODEL}:none", "messages": [{"role": "user", "content": long_text}]}
    error = assert_error(http.post("/v1/chat/completions", json=body), 400)
    assert "4096" in error["message"]


@pytest.mark.parametrize("model", ["no-such-model", f"{MODEL}:no-such-method", "no-such-model:ngram"])
def test_unknown_model_or_method(http: httpx.Client, model: str) -> None:
    body = {"model": model, "messages": MESSAGES}
    assert_error(http.post("/v1/chat/completions", json=body), 404, code="model_not_found")
    assert_error(http.post("/v1/completions", json={"model": model, "prompt": "x"}), 404, code="model_not_found")


def test_unknown_method_in_header(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES}, headers={"X-Spec-Method": "eagle9"}
    )
    assert_error(reply, 404, code="model_not_found")


def test_bad_completion_prompts(http: httpx.Client) -> None:
    for prompt in ([], 42, None, {"text": "x"}):
        assert_error(http.post("/v1/completions", json={"model": MODEL, "prompt": prompt}), 400)


def test_unknown_route_and_method(http: httpx.Client) -> None:
    assert_error(http.get("/v1/nothing"), 404)
    assert_error(http.get("/v1/chat/completions"), 405)


def test_openai_client_sees_typed_errors(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}], max_tokens=-1)


def test_still_serving_after_errors(http: httpx.Client) -> None:
    for body in BAD_BODIES.values():
        http.post("/v1/chat/completions", json=body)
    reply = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4})
    assert reply.status_code == 200
    assert http.get("/ready").status_code == 200
