"""Chat and text completions through the real gateway, with the official
openai client and raw httpx: shapes, streaming, sampling fields, the record."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import MODEL

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def check_record(record: dict[str, Any], method: str, completion_tokens: int) -> None:
    assert record["model"] == MODEL
    assert record["method"] == method
    assert record["engine"] == f"{MODEL}:{method}"
    assert record["completion_tokens"] == completion_tokens
    assert record["ttft_s"] is not None and record["ttft_s"] > 0
    assert record["e2e_s"] is not None and record["e2e_s"] >= record["ttft_s"]
    if method == "none":
        assert record["speculative_method"] == "none"
        for key in (
            "num_speculative_tokens",
            "mean_acceptance_length",
            "draft_acceptance_rate",
            "acceptance_histogram",
            "num_draft_tokens",
            "num_accepted_draft_tokens",
            "num_spec_steps",
        ):
            assert record[key] is None, key
        return
    assert record["speculative_method"] == "ngram"
    assert record["num_speculative_tokens"] == 4
    steps, accepted, drafted = record["num_spec_steps"], record["num_accepted_draft_tokens"], record["num_draft_tokens"]
    assert 0 <= accepted <= drafted <= 4 * steps
    histogram = record["acceptance_histogram"]
    assert len(histogram) == 5 and sum(histogram) == steps
    assert sum(j * c for j, c in enumerate(histogram)) == accepted
    if steps:
        assert record["mean_acceptance_length"] == pytest.approx(1 + accepted / steps)
        assert record["draft_acceptance_rate"] == pytest.approx(accepted / drafted)
    # Each step emits its accepted drafts plus one token; the rest are plain steps.
    assert steps + accepted <= completion_tokens


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_chat_non_streamed(client: openai.OpenAI, method: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=f"{MODEL}:{method}", messages=QUESTION, temperature=0, max_tokens=30
    )
    assert raw.headers["x-spec-method"] == method
    completion = raw.parse()
    assert completion.object == "chat.completion"
    assert "Paris" in (completion.choices[0].message.content or "")
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage is not None and completion.usage.prompt_tokens > 0
    check_record(completion.model_extra["specgate"], method, completion.usage.completion_tokens)


def test_default_method_and_header_override(client: openai.OpenAI) -> None:
    default = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=5)
    assert default.model_extra["specgate"]["method"] == "ngram"
    overridden = client.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=5, extra_headers={"X-Spec-Method": "none"}
    )
    assert overridden.model_extra["specgate"]["method"] == "none"
    assert overridden.model == f"{MODEL}:none"


@pytest.mark.parametrize("method", ["none", "ngram"])
def test_chat_streamed_with_usage(client: openai.OpenAI, method: str) -> None:
    stream = client.chat.completions.create(
        model=f"{MODEL}:{method}",
        messages=QUESTION,
        temperature=0,
        max_tokens=30,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finals] == ["stop"]
    last = chunks[-1]
    assert last.choices == [] and last.usage is not None
    assert all(c.usage is None for c in chunks[:-1])
    check_record(last.model_extra["specgate"], method, last.usage.completion_tokens)


def test_stream_sse_framing(http: httpx.Client) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 8, "stream": True}
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    events = [json.loads(line[6:]) for line in lines[:-1]]
    assert all("usage" not in e for e in events)  # include_usage not asked
    # Without include_usage the record rides on the last chunk before [DONE].
    assert "specgate" in events[-1] and all("specgate" not in e for e in events[:-1])
    assert {e["id"] for e in events} == {events[0]["id"]}


@pytest.mark.parametrize("stream", [False, True])
def test_no_cors_unless_configured(http: httpx.Client, stream: bool) -> None:
    # CORS is the gateway's policy (off here): no engine's application answers a
    # browser's origin in its place.
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 2, "stream": stream}
    reply = http.post("/v1/chat/completions", json=body, headers={"Origin": "https://elsewhere.example"})
    assert reply.status_code == 200
    assert not [name for name in reply.headers if name.lower().startswith("access-control-")]


@pytest.mark.parametrize("stream", [False, True])
def test_completions(client: openai.OpenAI, stream: bool) -> None:
    kwargs: dict[str, Any] = {
        "model": f"{MODEL}:ngram",
        "prompt": "The capital of France is",
        "temperature": 0,
        "max_tokens": 12,
    }
    if not stream:
        completion = client.completions.create(**kwargs)
        assert completion.object == "text_completion"
        assert completion.usage is not None
        check_record(completion.model_extra["specgate"], "ngram", completion.usage.completion_tokens)
        assert "Paris" in completion.choices[0].text
        return
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].usage is not None
    check_record(chunks[-1].model_extra["specgate"], "ngram", chunks[-1].usage.completion_tokens)


def test_completion_from_token_ids(http: httpx.Client) -> None:
    reply = http.post(
        "/v1/completions",
        json={"model": f"{MODEL}:none", "prompt": [504, 3575, 282], "max_tokens": 4, "temperature": 0},
    )
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["prompt_tokens"] == 3


def test_sampling_fields(client: openai.OpenAI) -> None:
    # Seeded sampling repeats on the baseline engine; vLLM's speculative engines
    # (0.32, CPU) do not promise it, so reproducibility is checked on "none".
    common: dict[str, Any] = {
        "model": f"{MODEL}:none",
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "temperature": 0.9,
        "top_p": 0.9,
        "seed": 1234,
        "max_completion_tokens": 20,
        "presence_penalty": 0.5,
        "frequency_penalty": 0.5,
    }
    first = client.chat.completions.create(**common)
    second = client.chat.completions.create(**common)
    assert first.choices[0].message.content == second.choices[0].message.content  # seeded
    assert first.usage is not None and first.usage.completion_tokens <= 20
    several = client.chat.completions.create(**{**common, "model": f"{MODEL}:ngram", "n": 3, "seed": None})
    assert sorted(c.index for c in several.choices) == [0, 1, 2]
    assert several.usage is not None
    record = several.model_extra["specgate"]
    assert record["completion_tokens"] == several.usage.completion_tokens
    assert record["num_spec_steps"] is not None


def test_stop_and_max_tokens(client: openai.OpenAI) -> None:
    prompt = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
    stopped = client.chat.completions.create(
        model=f"{MODEL}:ngram", messages=prompt, temperature=0, max_tokens=100, stop=["5"]
    )
    assert stopped.choices[0].finish_reason == "stop"
    assert "5" not in (stopped.choices[0].message.content or "")
    capped = client.chat.completions.create(model=f"{MODEL}:ngram", messages=prompt, temperature=0, max_tokens=3)
    assert capped.choices[0].finish_reason == "length"
    assert capped.usage is not None and capped.usage.completion_tokens == 3


def test_logprobs(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=f"{MODEL}:ngram", messages=QUESTION, temperature=0, max_tokens=8, logprobs=True, top_logprobs=3
    )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None and len(content) == completion.usage.completion_tokens  # type: ignore[union-attr]
    # The tokens include the end-of-turn token, which is not part of the text.
    assert "".join(t.token for t in content).startswith(completion.choices[0].message.content or "")
    for token in content:
        assert len(token.top_logprobs) == 3
        assert token.logprob <= 0
        # greedy: the chosen token is the most likely one
        assert token.logprob == pytest.approx(token.top_logprobs[0].logprob)
    text = client.completions.create(model=f"{MODEL}:none", prompt="Hello", max_tokens=4, logprobs=2)
    lp = text.choices[0].logprobs
    assert lp is not None and lp.tokens is not None and len(lp.tokens) == 4
    # vLLM gives the top 2 and the sampled token, when it is not among them.
    assert lp.top_logprobs is not None and all(2 <= len(t) <= 3 for t in lp.top_logprobs)


def test_models_listing(client: openai.OpenAI) -> None:
    ids = {m.id for m in client.models.list()}
    assert {MODEL, f"{MODEL}:none", f"{MODEL}:ngram", f"{MODEL}:auto"} <= ids


def test_health_ready_engines(http: httpx.Client) -> None:
    assert http.get("/health").json() == {"status": "ok"}
    ready = http.get("/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    engines = {e["engine"]: e for e in http.get("/engines").json()["engines"]}
    assert engines[f"{MODEL}:ngram"]["speculative_config"]["method"] == "ngram"
    assert engines[f"{MODEL}:none"]["speculative_config"] is None
    assert all(e["up"] for e in engines.values())
