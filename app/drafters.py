"""Small random-weight drafters, in the exact checkpoint formats vLLM loads, for a
target model folder: they exercise each speculative method's vLLM code path on a
machine without the published drafters (docs/methods.md). Speculation is lossless
whatever the drafter, so greedy output must still equal the target's own.

Kinds: `eagle3` and `dflash` (random weights), and their constant-token probes
`eagle3-probe` and `dflash-probe`: a draft vocabulary of one token, so every draft
is that token and the accepted drafts of a greedy request are known exactly from
the baseline's output (docs/methods.md, "The probe").
`draft-model[-probe]` is a small independent model (`method: draft_model`), `dspark`
a DSpark drafter (validated by vLLM, not runnable on CPU). `mimo-mtp[-probe]` and
`gemma4` are targets, not drafters: the target with an MTP layer, for `method: mtp`
(section 4a of the reference notes), and a tiny Gemma-4 for the
`gemma4-assistant[-probe]` drafters (app/drafters_gemma4.py).

In a config, `speculative_config.model: "generated:<kind>"` names one; it is
written once per target into the cache folder (`specgate make-drafter` does the
same by hand). Formats: ../shared/reference/drafter-formats.md, sections 1, 2 and 4a.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

GENERATED_PREFIX = "generated:"
# Targets, not drafters: mimo-mtp* has an MTP layer (vLLM's `method: mtp`, see _mimo); gemma4 is for the assistants.
DRAFTER_KINDS = ("eagle3", "eagle3-probe", "dflash", "dflash-probe", "draft-model", "draft-model-probe", "dspark",
                 "gemma4-assistant", "gemma4-assistant-probe")
TARGET_KINDS = ("mimo-mtp", "mimo-mtp-probe", "gemma4")
WHOLE_MODELS = ("mimo-mtp", "draft-model", "gemma4")  # kinds (and their probes) that carry the tokenizer
KINDS = DRAFTER_KINDS + TARGET_KINDS
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
PROBE_TEXT = " of"  # a frequent English token: a probe's drafts are accepted now and then
SIDECAR = "specgate-drafter.json"
INIT_STD = 0.02


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
            "hidden_size": self.hidden, "intermediate_size": self.intermediate,
            "num_attention_heads": self.heads, "num_key_value_heads": self.kv_heads, "head_dim": self.head_dim,
            "hidden_act": "silu", "rms_norm_eps": self.eps, "max_position_embeddings": 8192,
            "rope_theta": self.rope_theta, "rope_scaling": None, "attention_bias": False, "mlp_bias": False,
            "tie_word_embeddings": False, "vocab_size": self.vocab, "bos_token_id": self.bos,
            "eos_token_id": self.eos, "torch_dtype": "bfloat16",
        }


def probe_token(target: Path) -> int:
    from tokenizers import Tokenizer

    ids = Tokenizer.from_file(str(target / "tokenizer.json")).encode(PROBE_TEXT, add_special_tokens=False).ids
    return int(ids[0])


def generated_drafter(target: Path, kind: str, cache_dir: Path, seed: int = 0) -> Path:
    """The drafter `kind` for `target`, written once under `cache_dir`."""
    if kind not in KINDS:
        raise ValueError(f"unknown drafter kind '{kind}' (kinds: {', '.join(KINDS)})")
    out = cache_dir / "drafters" / target.name / kind
    if (out / SIDECAR).exists() and json.loads((out / SIDECAR).read_text()).get("seed") == seed:
        return out
    tmp = out.parent / f".{kind}.{os.getpid()}.tmp"  # renamed when complete: a half-written one is never found
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_drafter(target, kind, tmp, seed)
        shutil.rmtree(out, ignore_errors=True)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def write_drafter(target: Path, kind: str, out: Path, seed: int = 0) -> None:
    import torch
    from safetensors.torch import save_file

    shape = TargetShape.of(target)
    probe = probe_token(target) if kind.endswith("-probe") else None
    generator = torch.Generator().manual_seed(seed)
    config, tensors = _build(target, kind, shape, probe, generator)
    if kind.removesuffix("-probe") in WHOLE_MODELS:
        for name in TOKENIZER_FILES:
            if (target / name).exists():
                shutil.copy(target / name, out / name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    sidecar = {"kind": kind, "target": str(target), "seed": seed, "probe_token": probe}
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1))


def _build(
    target: Path, kind: str, shape: TargetShape, probe: int | None, gen: Any
) -> tuple[dict[str, Any], dict[str, Any]]:
    from app.drafters_gemma4 import gemma4_assistant, gemma4_target

    base = kind.removesuffix("-probe")
    if base == "mimo-mtp":
        return _mimo(target, shape, probe, gen)
    if base == "gemma4":
        return gemma4_target(shape.vocab, probe_token(target), gen)
    if base == "gemma4-assistant":
        return gemma4_assistant(target, probe, gen)
    builders = {"eagle3": _eagle3, "dflash": _dflash, "draft-model": _draft_model, "dspark": _dspark}
    return builders[base](shape, probe, gen)


def _eagle3_aux_layers(shape: TargetShape) -> list[int]:
    return [2, shape.layers // 2, shape.layers - 3]  # vLLM's default for a Llama target


def _eagle3(shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    h, aux = shape.hidden, _eagle3_aux_layers(shape)
    draft_vocab = 1 if probe is not None else shape.vocab
    config = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", **shape.layer_config(),
        "num_hidden_layers": 1, "draft_vocab_size": draft_vocab, "target_hidden_size": h,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux, "use_aux_hidden_state": True},
    }
    tensors = {
        **_prefixed("midlayer.", _decoder_layer(shape, gen, attn_in=2 * h)),
        "midlayer.hidden_norm.weight": ones(h),
        "fc.weight": randn((h, len(aux) * h), gen),
        "norm.weight": ones(h),
        **_draft_head(shape, probe, gen),
    }
    return config, tensors


def _dflash(shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    h, layers = shape.hidden, 2
    target_layers = [1, shape.layers // 4, shape.layers // 2, 3 * shape.layers // 4, shape.layers - 2]
    config = {
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3", **shape.layer_config(),
        "num_hidden_layers": layers, "use_sliding_window": False, "sliding_window": None,
        "layer_types": ["full_attention"] * layers, "block_size": 4, "num_target_layers": shape.layers,
        "dflash_config": {"mask_token_id": _mask_token(shape), "target_layer_ids": target_layers},
    }
    if probe is not None:
        config["draft_vocab_size"] = 1
    tensors = {
        "fc.weight": randn((h, len(target_layers) * h), gen),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
        **{k: v for i in range(layers) for k, v in _prefixed(f"layers.{i}.", _qwen3_layer(shape, gen)).items()},
        **(_draft_head(shape, probe, gen) if probe is not None else {}),
    }
    return config, tensors


def _dspark(shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """DSpark in the Qwen3 layout (vLLM renames `DSparkDraftModel` + qwen3 to
    `Qwen3DSparkModel`): one Qwen3 layer over one target layer, and the Markov head
    (`markov_rank`, the one key its model code requires). vLLM validates it, but on
    the CPU no model runner serves DSpark (docs/methods.md); there is no probe."""
    h, target_layers, rank = shape.hidden, [shape.layers // 2], 1
    config = {
        "architectures": ["DSparkDraftModel"], "model_type": "qwen3", **shape.layer_config(),
        "num_hidden_layers": 1, "use_sliding_window": False, "sliding_window": None,
        "layer_types": ["full_attention"], "block_size": 3, "target_hidden_size": h,
        "target_layer_ids": target_layers, "use_aux_hidden_state": True, "mask_token_id": _mask_token(shape),
        "markov_rank": rank, "markov_head_type": "vanilla", "sample_from_anchor": True,
    }
    tensors = {
        "fc.weight": randn((h, len(target_layers) * h), gen),
        "hidden_norm.weight": ones(h),
        "norm.weight": ones(h),
        **_prefixed("layers.0.", _qwen3_layer(shape, gen)),
        "markov_head.markov_w1.weight": randn((shape.vocab, rank), gen),
        "markov_head.markov_w2.weight": randn((shape.vocab, rank), gen),
    }
    return config, tensors


def _draft_model(shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """A small independent model with the target's vocabulary (`method: draft_model`):
    a 2-layer Llama of width 256. The probe's layers are zero but for one o_proj bias
    along dimension 0, which swamps the token's embedding, and its head's only non-zero
    row, the probe's, reads that dimension: every draft is the probe."""
    import torch

    small = replace(shape, hidden=256, intermediate=512, heads=4, kv_heads=4, head_dim=64, layers=2)
    h = small.hidden
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", **small.layer_config(),
              "num_hidden_layers": small.layers, "attention_bias": probe is not None}
    head = randn((small.vocab, h), gen)
    tensors = {"model.embed_tokens.weight": randn((small.vocab, h), gen), "model.norm.weight": ones(h)}
    for i in range(small.layers):
        layer = _decoder_layer(small, gen, attn_in=h)
        if probe is not None:
            layer = {name: t if name.endswith("layernorm.weight") else t.zero_() for name, t in layer.items()}
            sizes = {"q": h, "k": h, "v": h, "o": h}
            layer.update({f"self_attn.{p}_proj.bias": torch.zeros(n, dtype=torch.bfloat16) for p, n in sizes.items()})
            layer["self_attn.o_proj.bias"][0] = 1.0 if i == 0 else 0.0
        tensors.update(_prefixed(f"model.layers.{i}.", layer))
    if probe is not None:
        head.zero_()
        head[probe, 0] = 1.0
    tensors["lm_head.weight"] = head
    return config, tensors


def _mimo(target: Path, shape: TargetShape, probe: int | None, gen: Any) -> tuple[dict[str, Any], dict[str, Any]]:
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
        **_decoder_layer(shape, gen, attn_in=shape.hidden),
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
    tensors.update(_prefixed("model.mtp_layers.0.", layer))
    config = json.loads((target / "config.json").read_text())
    config.update({
        "architectures": ["MiMoForCausalLM"], "model_type": "qwen2", "num_nextn_predict_layers": 1,
        "use_sliding_window": False, "sliding_window": None, "max_window_layers": shape.layers,
    })
    return config, tensors


def _mask_token(shape: TargetShape) -> int:
    """Any valid id that is not BOS/EOS: the embedding fed to DFlash's mask query slots."""
    return next(i for i in range(3, shape.vocab) if i not in (shape.bos, shape.eos))


def _decoder_layer(shape: TargetShape, gen: Any, attn_in: int) -> dict[str, Any]:
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


def _qwen3_layer(shape: TargetShape, gen: Any) -> dict[str, Any]:
    return {
        **_decoder_layer(shape, gen, attn_in=shape.hidden),
        "self_attn.q_norm.weight": ones(shape.head_dim),
        "self_attn.k_norm.weight": ones(shape.head_dim),
    }


def _draft_head(shape: TargetShape, probe: int | None, gen: Any) -> dict[str, Any]:
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


def _prefixed(prefix: str, tensors: dict[str, Any]) -> dict[str, Any]:
    return {prefix + name: tensor for name, tensor in tensors.items()}


def ones(n: int) -> Any:
    import torch

    return torch.ones(n, dtype=torch.bfloat16)


def randn(shape: tuple[int, int], gen: Any) -> Any:
    import torch

    return (torch.randn(shape, generator=gen) * INIT_STD).to(torch.bfloat16)
