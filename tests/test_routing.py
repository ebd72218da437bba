"""The router as a plain object: model, model:method, model:policy, header."""

from __future__ import annotations

import pytest

from app.config import ConfigError, parse_config
from app.engines.base import EngineId
from app.routing import RouteNotFoundError, Router

CONFIG = parse_config(
    {
        "models": {
            "qwen": {
                "target": "q",
                "default_method": "eagle3",
                "auto": {"exploration": 0},
                "methods": {"none": {}, "eagle3": {}, "dflash": {}},
            },
            "gemma": {"target": "g", "default_method": "none", "methods": {"none": {}}},
        }
    }
)


def router() -> Router:
    return Router.from_config(CONFIG)


def test_model_goes_to_its_default_method() -> None:
    route = router().route("qwen")
    assert route.engine == EngineId("qwen", "eagle3") and route.policy == "default"


def test_model_colon_method_selects_the_engine() -> None:
    route = router().route("qwen:dflash")
    assert route.engine == EngineId("qwen", "dflash") and route.policy == "explicit"


def test_header_overrides_both() -> None:
    assert router().route("qwen", "none").engine == EngineId("qwen", "none")
    assert router().route("qwen:dflash", " none ").policy == "header"


@pytest.mark.parametrize(
    ("model", "header"),
    [
        ("llama", None),
        ("qwen:medusa", None),
        ("qwen", "medusa"),
        ("", None),
        (":none", None),
        ("gemma:auto", None),
        ("qwen:ab", None),
    ],
)
def test_unknown_model_method_or_policy(model: str, header: str | None) -> None:
    with pytest.raises(RouteNotFoundError):
        router().route(model, header)


def test_a_policy_route_resolves_to_a_method_and_says_why() -> None:
    route = router().route("qwen:auto")
    # Nothing known yet: the cold start goes to the baseline.
    assert route.engine == EngineId("qwen", "none")
    assert route.decision.policy == "auto" and route.decision.reason == "cold_start"
    assert router().route("qwen", "auto").decision.policy == "auto"


def test_every_request_of_a_learning_model_carries_its_bucket() -> None:
    explicit = router().route("qwen:dflash").decision
    assert explicit.bucket == "prose/varied/sampled" and explicit.load == 0
    assert router().route("gemma").decision.bucket is None  # gemma has no auto: nothing to learn


def test_engine_ids_and_policy_routes() -> None:
    assert len(router().engine_ids()) == 4
    assert router().policy_routes("qwen") == ["auto"] and router().policy_routes("gemma") == []


def test_served_model_names_are_aliases_of_their_model() -> None:
    config = parse_config(
        {
            "models": {
                "qwen": {
                    "target": "q",
                    "default_method": "none",
                    "methods": {"none": {}, "eagle3": {}},
                    "serving": {"served_model_name": ["Qwen/Qwen3-8B", "qwen3"]},
                },
            }
        }
    )
    routed = Router.from_config(config)
    assert routed.route("Qwen/Qwen3-8B").engine == EngineId("qwen", "none")
    assert routed.route("qwen3:eagle3").engine == EngineId("qwen", "eagle3")
    with pytest.raises(ConfigError, match=r"models: other\.serving\.served_model_name: 'qwen' already names a model"):
        parse_config(
            {
                "models": {
                    "qwen": {"target": "q", "default_method": "none", "methods": {"none": {}}},
                    "other": {
                        "target": "o",
                        "default_method": "none",
                        "methods": {"none": {}},
                        "serving": {"served_model_name": ["qwen"]},
                    },
                }
            }
        )
