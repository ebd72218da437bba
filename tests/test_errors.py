"""Bad requests get a 4xx in OpenAI's error envelope and the server keeps serving."""

from __future__ import annotations

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
    assert error["type"] in {"invalid_request_error", "service_unavailable", "server_error"}
    assert set(error) == {"message", "type", "param", "code"}
    if code is not None:
        assert error["code"] == code
    return dict(error)


BAD_BODIES: dict[str, dict[str, Any]] = {
    "missing messages": {"model": MODEL},
    "empty messages": {"model": MODEL, "messages": []},
    "messages not a list": {"model": MODEL, "messages": "hello"},
    "bad role": {"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]},
    "max_tokens wrong type": {"model": MODEL, "messages": MESSAGES, "max_tokens": "many"},
    "negative max_tokens": {"model": MODEL, "messages": MESSAGES, "max_tokens": -5},
    "temperature out of range": {"model": MODEL, "messages": MESSAGES, "temperature": 7},
    "n too large": {"model": MODEL, "messages": MESSAGES, "n": 1000},
    "unknown field": {"model": MODEL, "messages": MESSAGES, "tools_please": True},
    "greedy with n>1": {"model": MODEL, "messages": MESSAGES, "n": 2, "temperature": 0},
    "min_p on a speculating engine": {"model": f"{MODEL}:ngram", "messages": MESSAGES, "min_p": 0.1},
    "max_tokens beyond context": {"model": MODEL, "messages": MESSAGES, "max_tokens": 100000},
    "stream_options without stream": {"model": MODEL, "messages": MESSAGES,
                                      "stream_options": {"include_usage": True}},
}


@pytest.mark.parametrize("body", BAD_BODIES.values(), ids=BAD_BODIES.keys())
def test_bad_chat_request(http: httpx.Client, body: dict[str, Any]) -> None:
    assert_error(http.post("/v1/chat/completions", json=body), 400)


@pytest.mark.parametrize("stream", [False, True])
def test_engine_rejection_is_400_streamed_or_not(http: httpx.Client, stream: bool) -> None:
    body = {"model": f"{MODEL}:ngram", "messages": MESSAGES, "min_p": 0.2, "stream": stream}
    error = assert_error(http.post("/v1/chat/completions", json=body), 400)
    assert "min_p" in error["message"]


def test_min_p_is_fine_on_baseline(http: httpx.Client) -> None:
    body = {"model": f"{MODEL}:none", "messages": MESSAGES, "min_p": 0.1, "max_tokens": 4}
    assert http.post("/v1/chat/completions", json=body).status_code == 200


def test_malformed_json(http: httpx.Client) -> None:
    reply = http.post("/v1/chat/completions", content=b'{"model": "smollm2", "messages": [',
                      headers={"content-type": "application/json"})
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
    reply = http.post("/v1/chat/completions", json={"model": MODEL, "messages": MESSAGES},
                      headers={"X-Spec-Method": "eagle9"})
    assert_error(reply, 404, code="model_not_found")


def test_bad_completion_prompts(http: httpx.Client) -> None:
    for prompt in ([], ["a", "b"], 42, None):
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
