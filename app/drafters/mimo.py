"""The target re-packaged as a MiMo model with one MTP layer (`method: mtp`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.drafters.common import TargetShape, decoder_layer, ones, prefixed, randn


def mimo(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The target re-packaged as MiMo (a Qwen2 body, so zero q/k/v biases, plus one MTP
    layer): vLLM serves its MTP with `method: mtp`, and its own greedy output is the
    target's. The probe's MTP layer ignores its input and outputs norm(embed[probe])
    (zero input_proj and down_proj, attention values of 1 projected onto that row),
    so the tied lm_head always proposes the probe."""
    import torch
    from safetensors.torch import load_file

    tensors = load_file(str(target / "model.safetensors"))
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    biases = {f"self_attn.{proj}_proj.bias": size for proj, size in (("q", q), ("k", kv), ("v", kv))}
    for i in range(shape.layers):
        for name, size in biases.items():
            tensors[f"model.layers.{i}.{name}"] = torch.zeros(size, dtype=torch.bfloat16)
    layer = {
        **decoder_layer(shape, gen, attn_in=shape.hidden),
        "token_layernorm.weight": ones(shape.hidden),
        "hidden_layernorm.weight": ones(shape.hidden),
        "input_proj.weight": randn((shape.hidden, 2 * shape.hidden), gen),
        "final_layernorm.weight": ones(shape.hidden),
        **{name: torch.zeros(size, dtype=torch.bfloat16) for name, size in biases.items()},
    }
    if probe is not None:
        row = tensors["model.embed_tokens.weight"][probe].float()
        layer["input_proj.weight"].zero_()
        layer["self_attn.v_proj.weight"].zero_()
        layer["self_attn.v_proj.bias"].fill_(1)
        layer["self_attn.o_proj.weight"] = (row / q).unsqueeze(1).expand(shape.hidden, q).to(torch.bfloat16)
        layer["mlp.down_proj.weight"].zero_()
    tensors.update(prefixed("model.mtp_layers.0.", layer))
    config = json.loads((target / "config.json").read_text())
    config.update(
        {
            "architectures": ["MiMoForCausalLM"],
            "model_type": "qwen2",
            "num_nextn_predict_layers": 1,
            "use_sliding_window": False,
            "sliding_window": None,
            "max_window_layers": shape.layers,
        }
    )
    return config, tensors
