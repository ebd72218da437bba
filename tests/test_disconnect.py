"""A client that goes away aborts its engine request, streamed or not."""

from __future__ import annotations

import threading

import httpx

from tests.conftest import MODEL
from tests.support import wait_for

LONG = {
    "messages": [{"role": "user", "content": "Write a very long essay about the history of Europe."}],
    "max_tokens": 3000,
    "ignore_eos": True,
    "temperature": 0.7,
}


def unfinished(http: httpx.Client, engine: str) -> int:
    engines = {e["engine"]: e for e in http.get("/engines").json()["engines"]}
    return int(engines[engine]["unfinished_requests"])


def test_stream_disconnect_aborts(gateway_url: str, http: httpx.Client) -> None:
    engine = f"{MODEL}:ngram"
    body = {**LONG, "model": engine, "stream": True}
    with (
        httpx.Client(base_url=gateway_url, timeout=60) as own,
        own.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        lines = response.iter_lines()
        for _ in range(5):
            next(lines)
        assert unfinished(http, engine) == 1
    # 3000 tokens would take minutes on this CPU: reaching 0 now means aborted.
    assert wait_for(lambda: unfinished(http, engine) == 0, 15)


def test_non_stream_disconnect_aborts(gateway_url: str, http: httpx.Client) -> None:
    engine = f"{MODEL}:none"
    body = {**LONG, "model": engine}
    errors: list[BaseException] = []

    def impatient_client() -> None:
        try:
            httpx.post(f"{gateway_url}/v1/chat/completions", json=body, timeout=httpx.Timeout(4, connect=5))
        except httpx.ReadTimeout as exc:  # the client gives up and closes the connection
            errors.append(exc)

    thread = threading.Thread(target=impatient_client)
    thread.start()
    assert wait_for(lambda: unfinished(http, engine) == 1, 10)
    thread.join()
    assert errors, "the request should not have finished before the client gave up"
    assert wait_for(lambda: unfinished(http, engine) == 0, 15)
