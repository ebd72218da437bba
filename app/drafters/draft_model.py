"""A small independent draft model (`method: draft_model`) with the target's vocabulary."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from app.drafters.common import TargetShape, decoder_layer, ones, prefixed, randn


def draft_model(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A small independent model with the target's vocabulary (`method: draft_model`):
    a 2-layer Llama of width 256. The probe's layers are zero but for one o_proj bias
    along dimension 0, which swamps the token's embedding, and its head's only non-zero
    row, the probe's, reads that dimension: every draft is the probe."""
    import torch

    small = replace(shape, hidden=256, intermediate=512, heads=4, kv_heads=4, head_dim=64, layers=2)
    h = small.hidden
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        **small.layer_config(),
        "num_hidden_layers": small.layers,
        "attention_bias": probe is not None,
    }
    head = randn((small.vocab, h), gen)
    tensors = {"model.embed_tokens.weight": randn((small.vocab, h), gen), "model.norm.weight": ones(h)}
    for i in range(small.layers):
        layer = decoder_layer(small, gen, attn_in=h)
        if probe is not None:
            layer = {name: t if name.endswith("layernorm.weight") else t.zero_() for name, t in layer.items()}
            sizes = {"q": h, "k": h, "v": h, "o": h}
            layer.update({f"self_attn.{p}_proj.bias": torch.zeros(n, dtype=torch.bfloat16) for p, n in sizes.items()})
            layer["self_attn.o_proj.bias"][0] = 1.0 if i == 0 else 0.0
        tensors.update(prefixed(f"model.layers.{i}.", layer))
    if probe is not None:
        head.zero_()
        head[probe, 0] = 1.0
    tensors["lm_head.weight"] = head
    return config, tensors
