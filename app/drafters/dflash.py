"""DFlash (`method: dflash`) and DSpark (`method: dspark`) drafters: Qwen3 layers over
several of the target's hidden states, predicting a block of tokens at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from app.drafters.common import TargetShape, draft_head, mask_token, ones, prefixed, qwen3_layer, randn


def dflash(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    h, layers = shape.hidden, 2
    target_layers = [1, shape.layers // 4, shape.layers // 2, 3 * shape.layers // 4, shape.layers - 2]
    config = {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        **shape.layer_config(),
        "num_hidden_layers": layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"] * layers,
        "block_size": 4,
        "num_target_layers": shape.layers,
        "dflash_config": {"mask_token_id": mask_token(shape), "target_layer_ids": target_layers},
    }
    if probe is not None:
        config["draft_vocab_size"] = 1
    tensors = {
        "fc.weight": randn((h, len(target_layers) * h), gen),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
        **{k: v for i in range(layers) for k, v in prefixed(f"layers.{i}.", qwen3_layer(shape, gen)).items()},
        **(draft_head(shape, probe, gen) if probe is not None else {}),
    }
    return config, tensors


def dspark(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """DSpark in the Qwen3 layout (vLLM renames `DSparkDraftModel` + qwen3 to
    `Qwen3DSparkModel`): one Qwen3 layer over one target layer, and the Markov head
    (`markov_rank`, the one key its model code requires). vLLM validates it, but on
    the CPU no model runner serves DSpark (docs/methods.md); there is no probe."""
    h, target_layers, rank = shape.hidden, [shape.layers // 2], 1
    config = {
        "architectures": ["DSparkDraftModel"],
        "model_type": "qwen3",
        **shape.layer_config(),
        "num_hidden_layers": 1,
        "use_sliding_window": False,
        "sliding_window": None,
        "layer_types": ["full_attention"],
        "block_size": 3,
        "target_hidden_size": h,
        "target_layer_ids": target_layers,
        "use_aux_hidden_state": True,
        "mask_token_id": mask_token(shape),
        "markov_rank": rank,
        "markov_head_type": "vanilla",
        "sample_from_anchor": True,
    }
    tensors = {
        "fc.weight": randn((h, len(target_layers) * h), gen),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
        **prefixed("layers.0.", qwen3_layer(shape, gen)),
        "markov_head.markov_w1.weight": randn((shape.vocab, rank), gen),
        "markov_head.markov_w2.weight": randn((shape.vocab, rank), gen),
    }
    return config, tensors
