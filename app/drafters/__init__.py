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
`gemma4-assistant[-probe]` drafters (gemma4.py).

In a config, `speculative_config.model: "generated:<kind>"` names one; it is
written once per target into the cache folder (`specgate make-drafter` does the
same by hand). Formats: ../shared/reference/drafter-formats.md, sections 1, 2 and 4a.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.drafters import dflash, draft_model, eagle3, gemma4, mimo
from app.drafters.common import TargetShape, probe_token

__all__ = [
    "DRAFTER_KINDS",
    "GENERATED_PREFIX",
    "KINDS",
    "SIDECAR",
    "TARGET_KINDS",
    "TargetShape",
    "generated_drafter",
    "probe_token",
    "write_drafter",
]

GENERATED_PREFIX = "generated:"
# Targets, not drafters: mimo-mtp* has an MTP layer (vLLM's `method: mtp`, see mimo.py); gemma4 is for the assistants.
DRAFTER_KINDS = (
    "eagle3",
    "eagle3-probe",
    "dflash",
    "dflash-probe",
    "draft-model",
    "draft-model-probe",
    "dspark",
    "gemma4-assistant",
    "gemma4-assistant-probe",
)
TARGET_KINDS = ("mimo-mtp", "mimo-mtp-probe", "gemma4")
WHOLE_MODELS = ("mimo-mtp", "draft-model", "gemma4")  # kinds (and their probes) that carry the tokenizer
KINDS = DRAFTER_KINDS + TARGET_KINDS
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")
SIDECAR = "specgate-drafter.json"

# kind (without -probe) -> (target folder, its shape, the probe token or None, RNG) -> (config.json, tensors)
Builder = Callable[[Path, TargetShape, "int | None", Any], tuple[dict[str, Any], dict[str, Any]]]
BUILDERS: dict[str, Builder] = {
    "eagle3": eagle3.eagle3,
    "dflash": dflash.dflash,
    "dspark": dflash.dspark,
    "draft-model": draft_model.draft_model,
    "mimo-mtp": mimo.mimo,
    "gemma4": gemma4.target,
    "gemma4-assistant": gemma4.assistant,
}


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
    config, tensors = BUILDERS[kind.removesuffix("-probe")](target, shape, probe, generator)
    if kind.removesuffix("-probe") in WHOLE_MODELS:
        for name in TOKENIZER_FILES:
            if (target / name).exists():
                shutil.copy(target / name, out / name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    sidecar = {"kind": kind, "target": str(target), "seed": seed, "probe_token": probe}
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=1))
