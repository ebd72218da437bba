"""Gemma-4 MTP assistants (vLLM's `method: mtp` with `model: <assistant>`) and a
tiny Gemma-4 text target for them: the assistant reads the target's KV cache, so
it needs a Gemma-4 target, and none small enough exists. Both random (bf16), the
target with the tokenizer of the folder it is made from.

`gemma4` (target): 4 layers of width 256, sliding and full attention alternating,
head_dim 64 everywhere (a different `global_head_dim` makes vLLM ask for Triton
attention), no per-layer embeddings. Its own `lm_head` has the probe token's row
scaled up, so its greedy output contains the probe now and then; a random Gemma-4
stack otherwise almost never writes a given token.

`gemma4-assistant[-probe]` (drafter): 2 layers of width 128, one per attention
type, query-only attention over the target's cache (vLLM maps assistant layer i to
the last target layer of its type), `pre_projection` over [embed; hidden],
`post_projection` back to the target's width, a tied draft-width head. The probe
zeroes what reads the input and gives each layer an o_proj bias along dimension 0,
so its final state is c*e_0 and the head's only non-zero entry in column 0, the
probe's, makes every draft the probe. `use_ordered_embeddings` stays false: its
centroid head builds a CUDA graph at load, which fails on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.drafters.common import TargetShape, ones, probe_token, randn

WIDTH, INTERMEDIATE, LAYERS, HEADS, KV_HEADS, HEAD_DIM = 256, 1024, 4, 4, 2, 64
ASSISTANT_WIDTH, ASSISTANT_INTERMEDIATE, ASSISTANT_HEADS = 128, 512, 4
LAYER_TYPES = ["sliding_attention", "full_attention"]
PROBE_BOOST = 5.0  # of the probe's lm_head row: isolated hits in greedy output (a tied row would repeat itself)
ROPE = {
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0},
}


def target(folder: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The tiny Gemma-4 target, with the tokenizer of `folder` (always boosting the probe token)."""
    return gemma4_target(shape.vocab, probe_token(folder), gen)


def assistant(folder: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    return gemma4_assistant(folder, probe, gen)


def gemma4_target(vocab: int, probe: int, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    config = {
        "architectures": ["Gemma4ForCausalLM"],
        **_text_config(vocab, WIDTH, INTERMEDIATE, LAYER_TYPES * (LAYERS // 2), HEADS, kv_shared=0),
        "final_logit_softcapping": 30.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    tensors = {"model.embed_tokens.weight": randn((vocab, WIDTH), gen), "model.norm.weight": ones(WIDTH)}
    for i in range(LAYERS):
        layer = _layer(WIDTH, INTERMEDIATE, HEADS, gen)
        layer["self_attn.k_proj.weight"] = randn((KV_HEADS * HEAD_DIM, WIDTH), gen)
        layer["self_attn.v_proj.weight"] = randn((KV_HEADS * HEAD_DIM, WIDTH), gen)
        layer["self_attn.k_norm.weight"] = ones(HEAD_DIM)
        tensors.update({f"model.layers.{i}.{name}": t for name, t in layer.items()})
    head = randn((vocab, WIDTH), gen)
    head[probe] *= PROBE_BOOST
    tensors["lm_head.weight"] = head
    return config, tensors


def gemma4_assistant(target: Path, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    import torch

    backbone = json.loads((target / "config.json").read_text())
    if backbone.get("architectures") != ["Gemma4ForCausalLM"]:
        raise ValueError(f"a Gemma-4 assistant needs a Gemma-4 text target (generated:gemma4), not {target}")
    vocab, width, w = int(backbone["vocab_size"]), int(backbone["hidden_size"]), ASSISTANT_WIDTH
    text = _text_config(vocab, w, ASSISTANT_INTERMEDIATE, LAYER_TYPES, ASSISTANT_HEADS, kv_shared=len(LAYER_TYPES))
    text.update({"final_logit_softcapping": None, "attention_bias": probe is not None, "tie_word_embeddings": True})
    config = {
        "architectures": ["Gemma4AssistantForCausalLM"],
        "model_type": "gemma4_assistant",
        "backbone_hidden_size": width,
        "use_ordered_embeddings": False,
        "num_centroids": 2048,
        "centroid_intermediate_top_k": 32,
        "tie_word_embeddings": True,
        "text_config": text,
        "torch_dtype": "bfloat16",
    }
    tensors = {
        "model.embed_tokens.weight": randn((vocab, w), gen),  # the tied draft-width head
        "pre_projection.weight": randn((w, 2 * width), gen),
        "post_projection.weight": randn((width, w), gen),
        "model.norm.weight": ones(w),
    }
    for i in range(len(LAYER_TYPES)):
        layer = _layer(w, ASSISTANT_INTERMEDIATE, ASSISTANT_HEADS, gen)
        if probe is not None:
            layer["self_attn.q_proj.bias"] = torch.zeros(ASSISTANT_HEADS * HEAD_DIM, dtype=torch.bfloat16)
            layer["self_attn.o_proj.weight"].zero_()
            layer["self_attn.o_proj.bias"] = torch.zeros(w, dtype=torch.bfloat16)
            layer["self_attn.o_proj.bias"][0] = 1
            layer["mlp.down_proj.weight"].zero_()
        tensors.update({f"model.layers.{i}.{name}": t for name, t in layer.items()})
    if probe is not None:
        tensors["pre_projection.weight"].zero_()
        tensors["model.embed_tokens.weight"][:, 0] = 0
        tensors["model.embed_tokens.weight"][probe, 0] = 1
    return config, tensors


def _text_config(
    vocab: int, width: int, intermediate: int, layer_types: list[str], heads: int, kv_shared: int
) -> dict[str, Any]:
    return {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "hidden_size": width,
        "intermediate_size": intermediate,
        "num_hidden_layers": len(layer_types),
        "num_attention_heads": heads,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        "global_head_dim": HEAD_DIM,
        "hidden_activation": "gelu_pytorch_tanh",
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
        "rope_parameters": ROPE,
        "sliding_window": 32,
        "layer_types": layer_types,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "num_kv_shared_layers": kv_shared,
        "attention_k_eq_v": False,
        "enable_moe_block": False,
        "use_double_wide_mlp": False,
        "attention_bias": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "pad_token_id": 2,
    }


def _layer(width: int, intermediate: int, heads: int, gen: Any) -> dict[str, Any]:
    return {
        **{
            f"{norm}.weight": ones(width)
            for norm in (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            )
        },
        "self_attn.q_proj.weight": randn((heads * HEAD_DIM, width), gen),
        "self_attn.q_norm.weight": ones(HEAD_DIM),
        "self_attn.o_proj.weight": randn((width, heads * HEAD_DIM), gen),
        "mlp.gate_proj.weight": randn((intermediate, width), gen),
        "mlp.up_proj.weight": randn((intermediate, width), gen),
        "mlp.down_proj.weight": randn((width, intermediate), gen),
        "layer_scalar": ones(1),
    }
