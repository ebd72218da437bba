"""One gateway for the whole session: the embedded default (SmolLM2, engines
`none` and `ngram`), started as `specgate serve` would start it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import openai
import pytest

from app.bench.gateway import START_TIMEOUT_S, ServerProcess, start_server
from tests.support import GatewayProcess, free_port, http_client, running_gateway

MODEL = "smollm2"
# Session fixtures that start vLLM engines: a test using one is an `engine` test.
ENGINE_FIXTURES = frozenset({"gateway", "http", "client", "gateway_url", "vllm_serve"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """`pytest -m "not engine"` runs every test that needs no vLLM engine (in well under a
    minute); modules that start gateways of their own carry the marker themselves."""
    for item in items:
        if ENGINE_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(tmp_path_factory.mktemp("gateway") / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="session")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with http_client(gateway.url) as client:
        yield client


@pytest.fixture(scope="session")
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", timeout=300, max_retries=0)


@pytest.fixture(scope="session")
def gateway_url(gateway: GatewayProcess) -> str:
    return gateway.url


@pytest.fixture(scope="session")
def vllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """`vllm serve` running the embedded config's n-gram engine, from the line
    `specgate vllm-command smollm2:ngram` prints: the remote engines' upstream, and
    the reference the gateway's answers are compared with (test_parity)."""
    from app.cli import read_config
    from app.config import Settings
    from app.engines.vllm_command import VLLM_SERVE, serve_args

    model = read_config(Settings(config=None)).models[MODEL]
    port = free_port()
    cmd = [*VLLM_SERVE, "--model", *serve_args(MODEL, model, "ngram"), "--host", "127.0.0.1", "--port", str(port)]
    server = start_server(cmd, port, tmp_path_factory.mktemp("vllm") / "vllm-serve.log", "vllm serve", "/v1/models")
    try:
        server.wait_ready(START_TIMEOUT_S)
        yield server
    finally:
        if server.interrupt() != 0:
            print(server.log()[-3000:])
