"""One gateway for the whole session: the embedded default (SmolLM2, engines
`none` and `ngram`), started as `specgate serve` would start it."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from tests.gateway import GatewayProcess, running_gateway

MODEL = "smollm2"


@pytest.fixture(scope="session")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    with running_gateway(tmp_path_factory.mktemp("gateway") / "gateway.log") as gw:
        yield gw


@pytest.fixture(scope="session")
def http(gateway: GatewayProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=gateway.url, timeout=httpx.Timeout(300, connect=10)) as client:
        yield client


@pytest.fixture(scope="session")
def client(gateway: GatewayProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused", timeout=300, max_retries=0)


def repo_root() -> Path:
    return Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def gateway_url(gateway: GatewayProcess) -> str:
    return gateway.url
