"""EAGLE-3 drafters (`method: eagle3`): one Llama layer over three of the target's hidden
states, and a draft head (a one-token vocabulary for the probe)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.drafters.common import TargetShape, decoder_layer, draft_head, ones, prefixed, randn


def aux_layers(shape: TargetShape) -> list[int]:
    return [2, shape.layers // 2, shape.layers - 3]  # vLLM's default for a Llama target


def eagle3(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    h, aux = shape.hidden, aux_layers(shape)
    draft_vocab = 1 if probe is not None else shape.vocab
    config = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        **shape.layer_config(),
        "num_hidden_layers": 1,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": h,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
    }
    tensors = {
        **prefixed("midlayer.", decoder_layer(shape, gen, attn_in=2 * h)),
        "midlayer.hidden_norm.weight": ones(h),
        "fc.weight": randn((h, len(aux) * h), gen),
        "norm.weight": ones(h),
        **draft_head(shape, probe, gen),
    }
    return config, tensors
