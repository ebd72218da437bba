"""Keys, scopes, /metrics on its own port, CORS and the body-size limit, against a
real gateway process. Its one engine is remote and points at a closed port, so
it starts in seconds: what is checked here happens before any engine (an
authorised request reaching the engine gets the engine's 503)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from tests.support import GatewayProcess, free_port, start_gateway, wait_for

pytestmark = pytest.mark.engine  # starts gateways of its own

API_KEY = "sk-test-api-0123456789"
FILE_KEY = "sk-test-from-file"
ADMIN_KEY = "sk-test-admin-9876543210"
ORIGIN = "https://dash.example.org"
MAX_BODY = 4096
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, int]]:
    tmp = tmp_path_factory.mktemp("security")
    config = {
        "models": {
            "m": {"target": "none", "default_method": "r", "methods": {"r": {"url": f"http://127.0.0.1:{free_port()}"}}}
        }
    }
    path = tmp / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    keys_file = tmp / "keys.txt"
    keys_file.write_text(f"# one key per line\n{FILE_KEY}\n")
    metrics_port = free_port()
    env = {
        "SPECGATE_API_KEYS": API_KEY,
        "SPECGATE_API_KEYS_FILE": str(keys_file),
        "SPECGATE_ADMIN_KEYS": ADMIN_KEY,
        "SPECGATE_METRICS_PORT": str(metrics_port),
        "SPECGATE_CORS_ORIGINS": ORIGIN,
        "SPECGATE_MAX_BODY_BYTES": str(MAX_BODY),
    }
    gateway = start_gateway(tmp / "gateway.log", path, extra_env=env)
    gateway.ready_path = "/health"  # /ready stays 503: its engine is down
    try:
        gateway.wait_ready(180)
        yield gateway, metrics_port
    finally:
        gateway.interrupt()


@pytest.fixture(scope="module")
def gw(secured: tuple[GatewayProcess, int]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=secured[0].url, timeout=30) as client:
        yield client


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_api_routes_need_a_key(gw: httpx.Client) -> None:
    for method, path, body in (
        ("POST", "/v1/chat/completions", CHAT),
        ("GET", "/v1/models", None),
        ("GET", "/engines", None),
    ):
        missing = gw.request(method, path, json=body)
        assert missing.status_code == 401, path
        assert missing.json()["error"]["code"] == "invalid_api_key"
        assert missing.headers["WWW-Authenticate"] == "Bearer"
        wrong = gw.request(method, path, json=body, headers=bearer(API_KEY + "x"))
        assert wrong.status_code == 401
        assert "Incorrect API key" in wrong.json()["error"]["message"]
        assert gw.request(method, path, json=body, headers={"Authorization": API_KEY}).status_code == 401
    for key in (API_KEY, FILE_KEY, ADMIN_KEY):
        assert gw.get("/v1/models", headers=bearer(key)).status_code == 200
    # Past the keys, the request reaches routing and the engine (down here).
    assert gw.post("/v1/chat/completions", json=CHAT, headers=bearer(API_KEY)).status_code == 503
    # Anthropic's clients send the key as x-api-key, on every route.
    messages = {"model": CHAT["model"], "max_tokens": 4, "messages": CHAT["messages"]}
    assert gw.post("/v1/messages", json=messages).status_code == 401
    assert gw.post("/v1/messages", json=messages, headers={"x-api-key": API_KEY + "x"}).status_code == 401
    assert gw.post("/v1/messages", json=messages, headers={"x-api-key": API_KEY}).status_code == 503


def test_probes_stay_open(gw: httpx.Client) -> None:
    assert gw.get("/health").status_code == 200
    ready = gw.get("/ready")
    assert ready.status_code == 503 and ready.json()["engines"] == {"m:r": False}


def test_metrics_only_on_their_own_port(gw: httpx.Client, secured: tuple[GatewayProcess, int]) -> None:
    assert gw.get("/metrics", headers=bearer(API_KEY)).status_code == 404
    scrape = httpx.get(f"http://127.0.0.1:{secured[1]}/metrics", timeout=10)
    assert scrape.status_code == 200
    assert 'specgate_requests_total{method="r",model="m",outcome="error"}' in scrape.text
    assert "specgate_engine_up" in scrape.text


def test_cors_only_for_the_configured_origin(gw: httpx.Client) -> None:
    preflight = {"Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization"}
    allowed = gw.options("/v1/chat/completions", headers={"Origin": ORIGIN, **preflight})
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-origin"] == ORIGIN
    other = gw.options("/v1/chat/completions", headers={"Origin": "https://evil.example", **preflight})
    assert "access-control-allow-origin" not in other.headers


def test_body_size_limit(gw: httpx.Client) -> None:
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}
    refused = gw.post("/v1/chat/completions", json=big, headers=bearer(API_KEY))
    assert refused.status_code == 413
    assert refused.json()["error"]["code"] == "request_too_large"

    def chunked() -> Iterator[bytes]:
        yield b'{"model": "m", "messages": [{"role": "user", "content": "'
        for _ in range(10):
            yield b"y" * 1000
        yield b'"}]}'

    streamed = gw.post(
        "/v1/chat/completions", content=chunked(), headers={**bearer(API_KEY), "Content-Type": "application/json"}
    )
    assert streamed.status_code == 413
    assert gw.get("/health").status_code == 200


def test_admin_scope_and_drain(gw: httpx.Client, secured: tuple[GatewayProcess, int]) -> None:
    assert gw.post("/admin/drain").status_code == 401
    denied = gw.post("/admin/drain", headers=bearer(API_KEY))
    assert denied.status_code == 403 and denied.json()["error"]["code"] == "insufficient_scope"
    drained = gw.post("/admin/drain", headers=bearer(ADMIN_KEY))
    assert drained.status_code == 202 and drained.json()["draining"] is True
    # Nothing in flight: the gateway stops on its own, with status 0.
    gateway = secured[0]
    assert wait_for(lambda: gateway.proc.poll() is not None, 30)
    assert gateway.proc.returncode == 0


def test_keys_file_that_cannot_be_read(tmp_path: Path) -> None:
    from app.config import ConfigError, Settings

    settings = Settings(api_keys_file=tmp_path / "missing.txt")
    with pytest.raises(ConfigError, match=r"api_keys_file .*missing\.txt: cannot read"):
        settings.keys("api")


def test_metrics_behind_a_key_on_the_api_port(tmp_path: Path) -> None:
    config = {
        "models": {
            "m": {"target": "none", "default_method": "r", "methods": {"r": {"url": f"http://127.0.0.1:{free_port()}"}}}
        }
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    env = {"SPECGATE_API_KEYS": API_KEY, "SPECGATE_METRICS_REQUIRE_KEY": "true"}
    gateway = start_gateway(tmp_path / "gateway.log", path, extra_env=env)
    gateway.ready_path = "/health"
    try:
        gateway.wait_ready(180)
        assert httpx.get(f"{gateway.url}/metrics", timeout=10).status_code == 401
        scrape = httpx.get(f"{gateway.url}/metrics", headers=bearer(API_KEY), timeout=10)
        assert scrape.status_code == 200 and "specgate_engine_up" in scrape.text
    finally:
        assert gateway.interrupt() == 0
