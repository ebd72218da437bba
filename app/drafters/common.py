"""What every generated drafter is made of: the target's shape, the probe token,
and random bf16 tensors in the layouts vLLM's drafter classes load."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

INIT_STD = 0.02
PROBE_TEXT = " of"  # a frequent English token: a probe's drafts are accepted now and then


@dataclass(frozen=True)
class TargetShape:
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    layers: int
    vocab: int
    eps: float
    rope_theta: float
    bos: int | None
    eos: int | None

    @staticmethod
    def of(target: Path) -> TargetShape:
        cfg = json.loads((target / "config.json").read_text())
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        return TargetShape(
            hidden=int(cfg["hidden_size"]),
            intermediate=int(cfg["intermediate_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            layers=int(cfg["num_hidden_layers"]),
            vocab=int(cfg["vocab_size"]),
            eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=float(rope.get("rope_theta", cfg.get("rope_theta", 10000.0))),
            bos=cfg.get("bos_token_id"),
            eos=cfg.get("eos_token_id"),
        )

    def layer_config(self) -> dict[str, Any]:
        return {
            "hidden_size": self.hidden,
            "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads,
            "num_key_value_heads": self.kv_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.eps,
            "max_position_embeddings": 8192,
            "rope_theta": self.rope_theta,
            "rope_scaling": None,
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "vocab_size": self.vocab,
            "bos_token_id": self.bos,
            "eos_token_id": self.eos,
            "torch_dtype": "bfloat16",
        }


def probe_token(target: Path) -> int:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(target / "tokenizer.json")).encode(PROBE_TEXT, add_special_tokens=False).ids
    return int(ids[0])


def probe_accepts(baseline: list[str], probe: str, n: int, limit: int) -> int:
    """The drafts a probe drafter gets accepted over a greedy answer of `limit` tokens:
    step by step, the run of probe tokens (at most n) where the step starts, then the
    target's own token. The first output token comes from the prefill, not a draft.
    `baseline` runs n tokens past the limit: vLLM counts the accepted drafts of the
    last step before it trims the output to max_tokens."""
    accepted, i = 0, 1
    while i < min(limit, len(baseline)):
        run = 0
        while run < n and i + run < len(baseline) and baseline[i + run] == probe:
            run += 1
        accepted += run
        i += run + 1
    return accepted


def mask_token(shape: TargetShape) -> int:
    """Any valid id that is not BOS/EOS: the embedding fed to DFlash's mask query slots."""
    return next(i for i in range(3, shape.vocab) if i not in (shape.bos, shape.eos))


def decoder_layer(shape: TargetShape, gen: Any, attn_in: int) -> dict[str, Any]:
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    return {
        "input_layernorm.weight": ones(h),
        "post_attention_layernorm.weight": ones(h),
        "self_attn.q_proj.weight": randn((shape.heads * shape.head_dim, attn_in), gen),
        "self_attn.k_proj.weight": randn((kv, attn_in), gen),
        "self_attn.v_proj.weight": randn((kv, attn_in), gen),
        "self_attn.o_proj.weight": randn((h, shape.heads * shape.head_dim), gen),
        "mlp.gate_proj.weight": randn((shape.intermediate, h), gen),
        "mlp.up_proj.weight": randn((shape.intermediate, h), gen),
        "mlp.down_proj.weight": randn((h, shape.intermediate), gen),
    }


def qwen3_layer(shape: TargetShape, gen: Any) -> dict[str, Any]:
    return {
        **decoder_layer(shape, gen, attn_in=shape.hidden),
        "self_attn.q_norm.weight": ones(shape.head_dim),
        "self_attn.k_norm.weight": ones(shape.head_dim),
    }


def draft_head(shape: TargetShape, probe: int | None, gen: Any) -> dict[str, Any]:
    """A probe's one-token draft vocabulary (`d2t` maps draft id 0 to the probe), else
    a full-vocabulary head of its own."""
    import torch

    if probe is None:
        return {"lm_head.weight": randn((shape.vocab, shape.hidden), gen)}
    t2d = torch.zeros(shape.vocab, dtype=torch.bool)
    t2d[probe] = True
    return {
        "lm_head.weight": randn((1, shape.hidden), gen),
        "d2t": torch.tensor([probe], dtype=torch.int64),  # target id = draft id + d2t[draft id]
        "t2d": t2d,
    }


def prefixed(prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {prefix + name: tensor for name, tensor in tensors.items()}


def ones(n: int) -> Any:
    import torch

    return torch.ones(n, dtype=torch.bfloat16)


def randn(shape: tuple[int, int], gen: Any) -> Any:
    import torch

    return (torch.randn(shape, generator=gen) * INIT_STD).to(torch.bfloat16)
