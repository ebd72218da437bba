"""The router as a plain object: model, model:method, header, policies."""

from __future__ import annotations

import pytest

from app.engines.base import EngineId
from app.routing import ModelEntry, RouteNotFoundError, Router

MODELS = {
    "qwen": ModelEntry("qwen", ("none", "eagle3", "dflash"), "eagle3"),
    "gemma": ModelEntry("gemma", ("none",), "none"),
}


def test_model_goes_to_its_default_method() -> None:
    route = Router(MODELS).route("qwen")
    assert route.engine == EngineId("qwen", "eagle3") and route.reason == "default"


def test_model_colon_method_selects_the_engine() -> None:
    route = Router(MODELS).route("qwen:dflash")
    assert route.engine == EngineId("qwen", "dflash") and route.reason == "explicit"


def test_header_overrides_both() -> None:
    router = Router(MODELS)
    assert router.route("qwen", "none").engine == EngineId("qwen", "none")
    assert router.route("qwen:dflash", " none ").reason == "header"


@pytest.mark.parametrize(("model", "header"), [("llama", None), ("qwen:medusa", None), ("qwen", "medusa"),
                                                ("", None), (":none", None)])
def test_unknown_model_or_method(model: str, header: str | None) -> None:
    with pytest.raises(RouteNotFoundError):
        Router(MODELS).route(model, header)


def test_a_policy_object_replaces_the_default_rule() -> None:
    class Cheapest:
        name = "cheapest"

        def choose(self, model: ModelEntry) -> str:
            return model.methods[0]

    route = Router(MODELS, policies={"qwen": Cheapest()}).route("qwen")
    assert route.engine == EngineId("qwen", "none") and route.reason == "cheapest"
    assert Router(MODELS, policies={"qwen": Cheapest()}).route("gemma").reason == "default"


def test_engine_ids_lists_every_pair() -> None:
    assert len(Router(MODELS).engine_ids()) == 4
