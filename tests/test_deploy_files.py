"""The deployment files, without a GPU or a container engine: Dockerfile.rocm (hadolint and
its wiring), deploy/docker-compose.yml (Docker Compose's own `config`), the Kubernetes
manifests (kubernetes-validate, the API's schemas), and the study's configs in
deploy/configs (their env files, GPU assignment and values, checked against the installed
vLLM; the two-host configs against the per-host files they join, with the host-2
commands in their headers checked against `specgate vllm-command`). Each external
checker also gets a broken file, to show that it can fail."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.util
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pydantic
import pytest
import yaml

from app.cli import _parser, main, settings_from
from app.config import SpecgateConfig, load_config, parse_config

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile.rocm"
COMPOSE = REPO / "deploy" / "docker-compose.yml"
K8S = REPO / "deploy" / "k8s"
CONFIG_DIR = REPO / "deploy" / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
# One gateway on host 1 for a target that needs two hosts: host 2's engines are remote.
TWO_HOSTS = sorted(CONFIG_DIR.glob("*-two-hosts-*.yaml"))
PER_HOST = [path for path in CONFIGS if path not in TWO_HOSTS]
DEPLOY_DOC = REPO / "docs" / "deploy.md"
GPUS_PER_HOST = 8
BASE_IMAGES = ("vllm/vllm-openai-rocm", "rocm/vllm")
ENTRYPOINT = ["specgate", "serve", "--config", "/config/specgate.yaml", "--host", "0.0.0.0"]
# The methods whose drafter is a checkpoint of its own (native MTP has none).
DRAFT_MODEL_METHODS = {"eagle3", "dflash", "dspark"}

# The study's "Example vLLM serve commands": target -> (tensor parallel size,
# {speculative method: (draft checkpoint, example N)}, environment).
STUDY: dict[str, tuple[int, dict[str, tuple[str | None, int]], dict[str, str]]] = {
    "google/gemma-4-26B-A4B-it": (
        2,
        {
            "mtp": ("google/gemma-4-26B-A4B-it-assistant", 4),
            "eagle3": ("RedHatAI/gemma-4-26B-A4B-it-speculator.eagle3", 1),
            "dflash": ("z-lab/gemma-4-26B-A4B-it-DFlash", 15),
        },
        {"VLLM_USE_V2_MODEL_RUNNER": "1"},
    ),
    "google/gemma-4-31B-it": (
        2,
        {
            "mtp": ("google/gemma-4-31B-it-assistant", 1),
            "eagle3": ("RedHatAI/gemma-4-31B-it-speculator.eagle3", 3),
            "dflash": ("z-lab/gemma-4-31B-it-DFlash", 15),
            "dspark": ("RedHatAI/gemma-4-31B-it-speculator.dspark", 7),
        },
        {},
    ),
    "Qwen/Qwen3-8B": (
        1,
        {
            "eagle3": ("RedHatAI/Qwen3-8B-Thinking-speculator.eagle3", 5),
            "dflash": ("z-lab/Qwen3-8B-DFlash-b16", 7),
            "dspark": ("deepseek-ai/dspark_qwen3_8b_block7", 11),
        },
        {},
    ),
    "Qwen/Qwen3.5-27B": (2, {"mtp": (None, 1), "dflash": ("z-lab/Qwen3.5-27B-DFlash", 15)}, {}),
    "Qwen/Qwen3.5-122B-A10B": (4, {"mtp": (None, 7), "dflash": ("z-lab/Qwen3.5-122B-A10B-DFlash", 15)}, {}),
    "Qwen/Qwen3.6-27B": (
        2,
        {"mtp": (None, 3), "dflash": ("z-lab/Qwen3.6-27B-DFlash", 15)},
        {"VLLM_USE_V2_MODEL_RUNNER": "1"},
    ),
    "Qwen/Qwen3.6-35B-A3B": (
        2,
        {"mtp": (None, 3), "dflash": ("z-lab/Qwen3.6-35B-A3B-DFlash", 15)},
        {"VLLM_ROCM_USE_AITER": "1"},
    ),
    "moonshotai/Kimi-K2.5": (
        4,
        {"eagle3": ("lightseekorg/kimi-k2.5-eagle3-mla", 3), "dflash": ("z-lab/Kimi-K2.5-DFlash", 7)},
        {"VLLM_ROCM_USE_AITER": "1", "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT4"},
    ),
    "MiniMaxAI/MiniMax-M3-MXFP8": (
        8,
        {"eagle3": ("Inferact/MiniMax-M3-EAGLE3", 3)},
        {
            "VLLM_ROCM_USE_AITER": "1",
            "VLLM_ROCM_USE_AITER_FUSION_SHARED_EXPERTS": "1",
            "VLLM_ROCM_QUICK_REDUCE_QUANTIZATION": "INT4",
            "VLLM_USE_BREAKABLE_CUDAGRAPH": "0",
            "VLLM_ROCM_USE_AITER_MOE": "1",
        },
    ),
}


# --------------------------------------------------------------------------- helpers


def tool(name: str) -> str:
    """A checker installed by the `test` extra (its wheel ships the binary) into this venv."""
    path = Path(sys.executable).parent / name
    found = str(path) if path.exists() else shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed: pip install -e '.[test]'")
    return found


def run(*args: str | Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*map(str, args)], capture_output=True, text=True, timeout=120, check=False, cwd=REPO, env=env
    )


def env_file(config: Path) -> Path:
    return config.with_suffix(".env")


def read_env_file(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return {key.strip(): value.strip() for key, value in pairs}


def header_env(config: Path) -> dict[str, str]:
    """The `# env:` line of a config's header comment: `none` or VAR=value pairs."""
    lines = [line for line in config.read_text().splitlines() if line.startswith("# env:")]
    assert len(lines) == 1, f"{config.name}: one '# env:' header line expected"
    words = lines[0].removeprefix("# env:").split()
    return {} if words == ["none"] else dict(word.split("=", 1) for word in words)


def engines(config: SpecgateConfig) -> list[tuple[str, str, dict[str, Any], dict[str, Any] | None]]:
    """(model, method, engine kwargs, speculative_config) of every in-process engine."""
    return [
        (name, method_name, model.engine_for(method_name).to_engine_kwargs(), method.speculative_config)
        for name, model in config.models.items()
        for method_name, method in model.methods.items()
        if not method.remote
    ]


def remote_methods(config: SpecgateConfig) -> list[tuple[str, str, str, dict[str, Any] | None]]:
    """(model, method, url, speculative_config) of every remote engine."""
    return [
        (name, method_name, method.url, method.speculative_config)
        for name, model in config.models.items()
        for method_name, method in model.methods.items()
        if method.url is not None
    ]


def per_host_files(model_name: str) -> list[Path]:
    """The per-host configs that serve `model_name` (one, or one per host)."""
    return [path for path in PER_HOST if model_name in load_config(path).models]


def per_host_file_of(model_name: str, method: str) -> Path:
    """The one per-host config that runs `model_name:method` in-process."""
    (path,) = [path for path in per_host_files(model_name) if method in load_config(path).models[model_name].methods]
    return path


def vllm_command(config: Path, engine: str) -> list[str]:
    """What `specgate vllm-command --config CONFIG ENGINE` prints, split as a shell would."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["vllm-command", "--config", str(config), engine]) == 0
    return shlex.split(out.getvalue())


def header(text: str) -> list[str]:
    """A config's leading comment lines, without their '#'."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line[1:])
    return lines


def header_commands(text: str) -> list[list[str]]:
    """The `docker run` commands of a header (continued with a trailing backslash), split."""
    commands, current = [], ""
    for line in header(text):
        if current or line.strip().startswith("docker run"):
            current += " " + line.strip().removesuffix("\\")
            if not line.rstrip().endswith("\\"):
                commands.append(shlex.split(current))
                current = ""
    assert not current, "a command's last line ends with a backslash"
    return commands


def docker_run(argv: list[str]) -> tuple[dict[str, list[str]], str, list[str]]:
    """`docker run OPTIONS IMAGE ARGS` -> ({option: [values]}, image, args)."""
    assert argv[:2] == ["docker", "run"], argv[:2]
    flags_with_value = {"--name", "--restart", "--group-add", "--security-opt", "-v", "-e", "-p", "--entrypoint"}
    options: dict[str, list[str]] = {}
    i = 2
    while argv[i].startswith("-"):
        name, eq, value = argv[i].partition("=")
        if eq:
            options.setdefault(name, []).append(value)
        elif name in flags_with_value:
            i += 1
            options.setdefault(name, []).append(argv[i])
        else:
            options.setdefault(name, []).append("")
        i += 1
    return options, argv[i], argv[i + 1 :]


def image_rocm_env() -> dict[str, str]:
    """The VLLM_ROCM_* variables specgate's image sets: the environment its engines get
    before a config's .env."""
    steps = dockerfile_instructions()
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(args for op, args in steps if op == "ENV")))
    return {name: value for name, value in env.items() if name.startswith("VLLM_ROCM_")}


def header_command_problems(config: Path, text: str) -> list[str]:
    """How the host-2 `docker run` lines of a two-host config's header differ from what
    they must be: `specgate vllm-command` of the remote method in its per-host file, in
    the vLLM image Dockerfile.rocm builds on, on the url's port, with the environment
    the engine has in specgate's image."""
    remote = {
        httpx.URL(url).port: (model, method)
        for model, method, url, _ in remote_methods(parse_config(yaml.safe_load(text), source=config.name))
    }
    (base,) = [args for op, args in dockerfile_instructions() if op == "FROM"]
    problems: list[str] = []
    commands = header_commands(text)
    if len(commands) != len(remote):
        problems.append(f"{len(commands)} docker run commands for {len(remote)} remote methods")
    for argv in commands:
        options, image, args = docker_run(argv)
        (published,) = options.get("-p", ["?"])
        host_port, _, container_port = published.partition(":")
        if not host_port.isdigit() or int(host_port) not in remote:
            problems.append(f"-p {published}: no remote method has port {host_port}")
            continue
        model, method = remote[int(host_port)]
        where = f"{model}:{method}"
        expected = vllm_command(per_host_file_of(model, method), where)
        if container_port != "8000" or "--port" in args:
            problems.append(f"{where}: vllm serve listens on 8000 (its default) in the container")
        if image != base:
            problems.append(f"{where}: image {image}, not {base} (Dockerfile.rocm's FROM)")
        if options.get("--entrypoint") != ["vllm"] or ["vllm", *args] != expected:
            problems.append(
                f"{where}: not `specgate vllm-command` of {per_host_file_of(model, method).name}:"
                f"\n  header: {shlex.join(['vllm', *args])}\n  prints: {shlex.join(expected)}"
            )
        env = dict(pair.split("=", 1) for pair in options.get("-e", []) if "=" in pair)
        wanted = {**image_rocm_env(), **read_env_file(env_file(per_host_file_of(model, method)))}
        if env != wanted:
            problems.append(f"{where}: environment {env}, not {wanted}")
        if "HF_TOKEN" not in options.get("-e", []):
            problems.append(f"{where}: HF_TOKEN is not passed from the shell")
        if set(options.get("--device", [])) != {"/dev/kfd", "/dev/dri"} or options.get("--ipc") != ["host"]:
            problems.append(f"{where}: the GPUs (--device /dev/kfd, /dev/dri) and --ipc=host")
    return problems


def fits(annotation: Any, value: Any) -> bool:
    """Would vLLM accept `value` for a field with this annotation? Enums by member name."""
    if isinstance(annotation, str):  # an unresolved forward reference: nothing to check against
        return True
    choices = typing.get_args(annotation) or (annotation,)
    enums = [a for a in choices if isinstance(a, type) and issubclass(a, enum.Enum)]
    if enums and isinstance(value, str):
        return any(value.upper() in e.__members__ for e in enums)
    try:
        pydantic.TypeAdapter(annotation).validate_python(value)
    except pydantic.ValidationError:
        return False
    return True


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    joined = re.sub(
        r"\\\n",
        " ",
        "\n".join(line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")),
    )
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined.splitlines() if line.strip()]


def check_vllm_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_vllm", REPO / "deploy" / "check_vllm.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose(*args: str, config: str | None = None, file: Path = COMPOSE) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECGATE_", "COMPOSE_", "HF_TOKEN"))}
    if config is not None:
        env["SPECGATE_CONFIG"] = config
    return run(tool("docker-compose"), "-f", file, *args, env=env)


def k8s(name: str) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((K8S / f"{name}.yaml").read_text())
    return doc


# --------------------------------------------------------------------------- Dockerfile.rocm


def test_dockerfile_passes_hadolint() -> None:
    proc = run(tool("hadolint"), "--no-color", DOCKERFILE)
    assert proc.returncode == 0, f"hadolint Dockerfile.rocm:\n{proc.stdout}{proc.stderr}"


def test_hadolint_check_is_not_vacuous(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu\nRUN apt-get install curl\nCMD python3 -m http.server\n")
    proc = run(tool("hadolint"), "--no-color", bad)
    assert proc.returncode != 0
    assert "DL3006" in proc.stdout  # untagged base image


def test_dockerfile_extends_a_pinned_vllm_rocm_image_without_a_second_vllm() -> None:
    steps = dockerfile_instructions()
    (base,) = [args for op, args in steps if op == "FROM"]
    image, _, tag = base.partition(":")
    assert image in BASE_IMAGES and tag and tag != "latest", base
    for op, args in steps:
        if op == "RUN":
            for install in re.findall(r"pip install[^&;|]*", args):
                assert not re.search(r"\b(vllm|torch|triton)\b", install), f"a second vLLM or torch: {install}"
    run_steps = " ".join(args for op, args in steps if op == "RUN")
    assert "--no-deps ." in run_steps, "specgate goes in without its dependencies"
    assert '["project"]["dependencies"]' in run_steps, "runtime dependencies come from pyproject.toml"
    assert "check_vllm.py configs/" in run_steps, "the image's vLLM is checked against the shipped configs"


def test_dockerfile_entrypoint_health_and_environment() -> None:
    steps = dockerfile_instructions()
    ops = dict(steps)
    assert json.loads(ops["ENTRYPOINT"]) == ENTRYPOINT
    settings = settings_from(_parser().parse_args(ENTRYPOINT[1:]))
    assert (str(settings.config), settings.host) == ("/config/specgate.yaml", "0.0.0.0")
    assert ops["EXPOSE"] == "8000"
    assert "/health" in ops["HEALTHCHECK"] and "--start-period=" in ops["HEALTHCHECK"]
    env = dict(re.findall(r"(\w+)=(\S+)", " ".join(args for op, args in steps if op == "ENV")))
    assert env["HF_HUB_OFFLINE"] == "0", "specgate defaults to offline; the image's operators download models"
    assert env["VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT"] == "0", "vLLM cannot speculate with the shuffled KV layout"
    assert env["HF_HOME"].startswith("/data/") and env["SPECGATE_PORT"] == "8000"
    import vllm.envs

    unknown = {name for name in env if name.startswith("VLLM_")} - set(vllm.envs.environment_variables)
    assert not unknown, f"not vLLM environment variables: {unknown}"


def test_dockerignore_lets_every_copied_path_in() -> None:
    allowed = [
        line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines() if line.startswith("!")
    ]
    for op, args in dockerfile_instructions():
        if op == "COPY":
            for source in args.split()[:-1]:
                assert any(source == a or source.startswith(a + "/") for a in allowed), f".dockerignore drops {source}"
                assert (REPO / source).exists(), source


def test_check_vllm_accepts_the_configs_and_names_what_vllm_lacks(tmp_path: Path) -> None:
    check = check_vllm_module()
    assert check.problems(CONFIGS) == []
    bad = tmp_path / "bad.yaml"
    spec = {"method": "medusa2", "num_speculative_tokens": 3, "draft_tp": 2}
    bad.write_text(
        yaml.safe_dump(
            {
                "models": {
                    "m": {
                        "target": "x",
                        "default_method": "s",
                        "engine": {"extra_args": {"enable_tool_parsing": True}},
                        "methods": {"s": {"speculative_config": spec}},
                    }
                }
            }
        )
    )
    found = "\n".join(check.problems([bad]))
    for expected in ("engine argument 'enable_tool_parsing'", "no field 'draft_tp'", "speculative method 'medusa2'"):
        assert expected in found


# --------------------------------------------------------------------------- deploy/configs


def test_the_configs_are_the_studys_commands() -> None:
    """Every drafter, N and TP size the study ran, per target, and nothing it did not run."""
    found: dict[str, dict[str, tuple[str | None, int]]] = {}
    baselines: set[str] = set()
    for path in CONFIGS:
        for name, model in load_config(path).models.items():
            tp, _, _ = STUDY[model.target]
            for method_name, method in model.methods.items():
                if not method.remote:  # a remote method's engine flags: its per-host file (tests below)
                    kwargs = model.engine_for(method_name).to_engine_kwargs()
                    assert kwargs.get("tensor_parallel_size", 1) == tp, f"{path.name}: {name}:{method_name}"
                spec = method.speculative_config
                if spec is None:
                    baselines.add(model.target)
                    continue
                entry = (spec.get("model"), spec["num_speculative_tokens"])
                assert found.setdefault(model.target, {}).setdefault(spec["method"], entry) == entry, path.name
    assert found == {target: methods for target, (_, methods, _) in STUDY.items()}
    assert baselines == set(STUDY)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_env_file_is_the_studys_and_named_in_the_header(config: Path) -> None:
    assert env_file(config).exists(), f"{config.name} needs {env_file(config).name} (compose reads it)"
    env = read_env_file(env_file(config))
    assert header_env(config) == env
    targets = {model.target for model in load_config(config).models.values()}
    assert [STUDY[target][2] for target in targets] == [env]


@pytest.mark.parametrize("path", sorted(CONFIG_DIR.glob("*.env")), ids=lambda p: p.stem)
def test_env_files_set_variables_vllm_knows_to_values_it_accepts(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import vllm.envs

    assert path.with_suffix(".yaml").exists(), f"{path.name} belongs to no config"
    for name, value in read_env_file(path).items():
        assert name in vllm.envs.environment_variables, f"{path.name}: vLLM has no {name}"
        monkeypatch.setenv(name, value)
        parsed = vllm.envs.environment_variables[name]()  # raises on a value outside a variable's choices
        if isinstance(parsed, bool):
            assert value in {"0", "1"}, f"{path.name}: {name}={value} is not a boolean vLLM reads"
    assert read_env_file(path).get("VLLM_ROCM_SHUFFLE_KV_CACHE_LAYOUT", "0") == "0"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_engines_have_their_own_gpus_on_one_host(config: Path) -> None:
    taken: dict[int, str] = {}
    for model, method, kwargs, _ in engines(load_config(config)):
        where = f"{config.name}: {model}:{method}"
        ids = kwargs.get("device_ids")
        assert ids, f"{where}: no device_ids"
        assert len(ids) == kwargs.get("tensor_parallel_size", 1) * kwargs.get("pipeline_parallel_size", 1), where
        for gpu in ids:
            assert 0 <= gpu < GPUS_PER_HOST, f"{where}: GPU {gpu}"
            assert gpu not in taken, f"{where}: GPU {gpu} is also {taken[gpu]}'s"
            taken[gpu] = f"{model}:{method}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_each_engine_is_built_on_its_own_devices(config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What can be checked of issue 18 without GPUs: the arguments each in-process engine
    is built with (app/engines/vllm_local.py) carry its GPUs and tensor parallelism, and
    vLLM resolves them to physical GPUs no other engine has, also inside a container that
    was given a subset of the host's GPUs (device_ids index the visible set, as
    `vllm serve --device-ids` does). The gateway sets no device variable of its own."""
    import huggingface_hub.constants
    import vllm.envs
    from vllm.platforms import current_platform

    from app.engines.base import EngineId
    from app.engines.vllm_local import build_engine_args

    # Offline, vLLM resolves a hub id to its cached folder while it builds the arguments,
    # and these checkpoints are not cached here; online it leaves the id alone. Building
    # arguments downloads nothing either way.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    # The CPU platform's device variable is a NUMA one; resolve as the GPU platforms do.
    monkeypatch.setattr(type(current_platform), "device_control_env_var", "CUDA_VISIBLE_DEVICES")
    visible = [7, 6, 5, 4, 3, 2, 1, 0]  # a container given the host's GPUs in another order
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", ",".join(map(str, visible)))
    # vLLM reads it through vllm.envs, which caches every variable once an engine core has
    # started in this process: set it there too.
    monkeypatch.setattr(vllm.envs, "CUDA_VISIBLE_DEVICES", ",".join(map(str, visible)), raising=False)
    loaded = load_config(config)
    owner: dict[int, str] = {}
    for model, method, kwargs, _ in engines(loaded):
        where = f"{config.name}: {model}:{method}"
        args = build_engine_args(EngineId(model, method), loaded.models[model])
        assert args.device_ids == kwargs["device_ids"], where
        assert args.tensor_parallel_size == kwargs.get("tensor_parallel_size", 1), where
        physical = args._resolve_device_ids()
        assert physical == [visible[i] for i in kwargs["device_ids"]], where
        for gpu in physical:
            assert gpu not in owner, f"{where}: physical GPU {gpu} is also {owner[gpu]}'s"
            owner[gpu] = f"{model}:{method}"
    source = "\n".join(p.read_text() for p in (REPO / "app").rglob("*.py"))
    for variable in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES"):
        assert variable not in source, f"the gateway sets {variable}: engines would not see the GPUs device_ids name"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_config_values_are_ones_vllm_accepts(config: Path) -> None:
    from vllm import AsyncEngineArgs
    from vllm.config.speculative import SpeculativeConfig
    from vllm.reasoning import ReasoningParserManager

    engine_types = {f.name: f.type for f in dataclasses.fields(AsyncEngineArgs)}
    spec_types = {f.name: f.type for f in dataclasses.fields(SpeculativeConfig)}
    parsers = set(ReasoningParserManager.reasoning_parsers) | set(ReasoningParserManager.lazy_parsers)
    loaded = load_config(config)
    for model, method, kwargs, _ in engines(loaded):
        where = f"{config.name}: {model}:{method}"
        for key, value in kwargs.items():
            assert fits(engine_types[key], value), f"{where}: {key}={value!r}"
        reasoning = loaded.models[model].serving.reasoning_parser
        if reasoning is not None:
            assert reasoning in parsers, where
    specs = [(model, method, spec) for model, method, _, spec in engines(loaded)]
    specs += [(model, method, spec) for model, method, _, spec in remote_methods(loaded)]
    for model, method, spec in specs:
        where = f"{config.name}: {model}:{method}"
        for key, value in (spec or {}).items():
            assert fits(spec_types[key], value), f"{where}: speculative_config.{key}={value!r}"
        if spec is not None:
            assert spec["num_speculative_tokens"] > 0, where
            if spec["method"] in DRAFT_MODEL_METHODS:
                assert spec.get("model"), f"{where}: {spec['method']} needs its draft checkpoint"


def test_value_check_is_not_vacuous() -> None:
    from vllm import AsyncEngineArgs
    from vllm.config.speculative import SpeculativeConfig

    engine_types = {f.name: f.type for f in dataclasses.fields(AsyncEngineArgs)}
    spec_types = {f.name: f.type for f in dataclasses.fields(SpeculativeConfig)}
    assert fits(engine_types["attention_backend"], "triton_attn")
    assert not fits(engine_types["attention_backend"], "TRITON")
    assert not fits(engine_types["linear_backend"], "emulaton")
    assert not fits(engine_types["attention_config"], {"indexer_kv_dtyp": "fp8"})
    assert not fits(spec_types["moe_backend"], "trition")


# --------------------------------------------------------------------------- two hosts, one gateway


def test_every_target_split_over_two_hosts_has_one_gateway_for_both() -> None:
    split = {name for path in PER_HOST for name in load_config(path).models if len(per_host_files(name)) > 1}
    joined = [name for path in TWO_HOSTS for name in load_config(path).models]
    assert sorted(joined) == sorted(split) and len(split) == 4, (joined, split)
    for path in CONFIGS:
        has_remote = bool(remote_methods(load_config(path)))
        assert has_remote == (path in TWO_HOSTS), f"{path.name}: remote methods only in *-two-hosts-* configs"


@pytest.mark.parametrize("config", TWO_HOSTS, ids=lambda p: p.stem)
def test_two_host_config_joins_its_per_host_files(config: Path) -> None:
    """Host 1's engines in-process as in a per-host file, host 2's speculating engines
    remote, with the speculative_config of the per-host file that runs them."""
    for name, model in load_config(config).models.items():
        sources = {path: load_config(path).models[name] for path in per_host_files(name)}
        assert {m for source in sources.values() for m in source.methods} == set(model.methods), config.name
        for method_name, method in model.methods.items():
            where = f"{config.name}: {name}:{method_name}"
            if method.remote:
                source = sources[per_host_file_of(name, method_name)]
                assert source.target == model.target, where
                assert method.speculative_config is not None, f"{where}: host 2 runs speculating engines only"
                assert method.speculative_config == source.methods[method_name].speculative_config, where
                continue
            kwargs = model.engine_for(method_name).to_engine_kwargs()
            assert any(
                source.target == model.target
                and (source.engine_for(method_name).to_engine_kwargs(), source.methods[method_name].speculative_config)
                == (kwargs, method.speculative_config)
                for source in sources.values()
                if method_name in source.methods
            ), f"{where}: not as in a per-host file"
        host1 = [
            path
            for path, source in sources.items()
            if set(source.methods) == {m for m, cfg in model.methods.items() if not cfg.remote}
        ]
        assert len(host1) == 1, f"{config.name}: host 1's in-process engines are those of one per-host file"


@pytest.mark.parametrize("config", TWO_HOSTS, ids=lambda p: p.stem)
def test_two_host_header_gives_host_2_exactly_what_vllm_command_prints(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # what `specgate` sets; restored after the test
    assert header_command_problems(config, config.read_text()) == []


def test_header_command_check_is_not_vacuous(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = CONFIG_DIR / "kimi-k2.5-two-hosts-mi300x.yaml"
    text = config.read_text()
    for old, new, expected in [
        ("--device-ids 4,5,6,7", "--device-ids 0,1,2,3", "not `specgate vllm-command`"),
        ("-e VLLM_ROCM_USE_AITER=1", "-e VLLM_ROCM_USE_AITER=0", "environment"),
        ("-p 8000:8000", "-p 8001:8000", "no remote method has port 8001"),
        ("vllm/vllm-openai-rocm:v", "vllm/vllm-openai-rocm:x", "Dockerfile.rocm's FROM"),
        ('num_speculative_tokens":7', 'num_speculative_tokens":3', "not `specgate vllm-command`"),
    ]:
        assert old in text, old
        found = "\n".join(header_command_problems(config, text.replace(old, new, 1)))
        assert expected in found, (old, found)
    assert "docker run commands for 1 remote methods" in "\n".join(
        header_command_problems(config, text.replace("#   docker run", "#   docker-run"))
    )


def same_value(expected: Any, parsed: Any) -> bool:
    """A config value against what vLLM's CLI made of it (a dict may become a config dataclass)."""
    if isinstance(expected, dict) and not isinstance(parsed, dict):
        return all(same_value(value, getattr(parsed, key)) for key, value in expected.items())
    return bool(expected == parsed)


@pytest.mark.parametrize("config", TWO_HOSTS, ids=lambda p: p.stem)
def test_host_2_commands_are_the_in_process_engines_for_vllm_serve(
    config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The installed vLLM's own `vllm serve` parser reads each host-2 line of the header into
    the engine arguments specgate gives the in-process engine of the per-host file (no
    engine, no download)."""
    import huggingface_hub.constants
    from vllm import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from app.engines.base import EngineId
    from app.engines.vllm_local import build_engine_args
    from app.engines.vllm_serving import make_arg_parser, validate_parsed_serve_args

    # Offline, vLLM resolves a hub id to its cached folder while it builds the arguments,
    # and these checkpoints are not cached here; online it leaves the id alone. Building
    # arguments downloads nothing either way.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    ports = {httpx.URL(url).port: (model, method) for model, method, url, _ in remote_methods(load_config(config))}
    for argv in header_commands(config.read_text()):
        options, _, args = docker_run(argv)
        model, method = ports[int(options["-p"][0].partition(":")[0])]
        source = load_config(per_host_file_of(model, method)).models[model]
        namespace = parser.parse_args(args[1:])  # after `serve`
        validate_parsed_serve_args(namespace)
        assert namespace.enable_per_request_metrics is True
        namespace.model = namespace.model_tag
        parsed = vars(AsyncEngineArgs.from_cli_args(namespace))
        expected = vars(build_engine_args(EngineId(model, method), source))
        keys = {
            *source.engine_for(method).to_engine_kwargs(),
            "model",
            "served_model_name",
            "tokenizer",
            "speculative_config",
            "per_request_spec_decode_metrics",
        }
        for key in sorted(keys):
            assert same_value(expected[key], parsed[key]), f"{config.name}: {model}:{method}: {key}"
        assert parsed["per_request_spec_decode_metrics"] == "summary"


def test_remote_urls_are_http_with_a_host_and_a_port() -> None:
    for path in TWO_HOSTS:
        seen: set[tuple[str, int]] = set()
        for model, method, url, _ in remote_methods(load_config(path)):
            where = f"{path.name}: {model}:{method}"
            parsed = httpx.URL(url)
            assert parsed.scheme == "http" and parsed.path in ("", "/"), f"{where}: {url}"
            # One DNS label: also a Docker Compose service or a Kubernetes Service name.
            assert re.fullmatch(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?", parsed.host), f"{where}: host of {url}"
            assert re.search(r":\d+$", url) and parsed.port, f"{where}: {url} names no port"
            assert (parsed.host, parsed.port) not in seen, f"{where}: {url} is another method's server"
            seen.add((parsed.host, parsed.port))


@pytest.mark.parametrize("config", TWO_HOSTS, ids=lambda p: p.stem)
def test_check_config_accepts_the_remote_methods(
    config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`specgate check-config` on the remote part (its in-process engines would need their
    checkpoints' configs from the Hub: test_check_vllm_* and test_config_values_* check
    those against the installed vLLM instead). A gateway of remote engines needs no GPU."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    raw = yaml.safe_load(config.read_text())
    expected = []
    for name, model in raw["models"].items():
        model["methods"] = {k: m for k, m in model["methods"].items() if "url" in m}
        model["default_method"] = next(iter(model["methods"]))
        expected += [
            f"ok  {name}:{k}  method={m['speculative_config']['method']}  "
            f"N={m['speculative_config']['num_speculative_tokens']}"
            for k, m in model["methods"].items()
        ]
    remote_only = tmp_path / config.name
    remote_only.write_text(yaml.safe_dump(raw))
    capsys.readouterr()
    assert main(["check-config", "--config", str(remote_only)]) == 0
    assert capsys.readouterr().out.splitlines() == expected

    model = next(iter(raw["models"].values()))
    next(iter(model["methods"].values()))["engine"] = {"device_ids": [0]}
    remote_only.write_text(yaml.safe_dump(raw))
    assert main(["check-config", "--config", str(remote_only)]) == 2
    assert "'engine' settings do not apply to a remote method" in capsys.readouterr().err


def test_deploy_doc_lists_every_variable_the_configs_set() -> None:
    doc = DEPLOY_DOC.read_text()
    for path in sorted(CONFIG_DIR.glob("*.env")):
        for name in read_env_file(path):
            assert f"`{name}`" in doc, f"docs/deploy.md does not explain {name} ({path.name})"
    for config in CONFIGS:
        assert config.name in doc, f"docs/deploy.md has no note on {config.name}"


# --------------------------------------------------------------------------- docker compose


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_compose_file_is_valid_with_every_config(config: Path) -> None:
    proc = compose("config", "--quiet", config=config.stem)
    assert proc.returncode == 0, f"docker-compose config ({config.stem}):\n{proc.stderr}"


def test_compose_check_is_not_vacuous(tmp_path: Path) -> None:
    assert compose("config", "--quiet", config="no-such-config").returncode != 0
    broken = tmp_path / "compose.yml"
    broken.write_text(COMPOSE.read_text().replace("ipc: host", "ipc: [host]"))
    proc = compose("config", "--quiet", file=broken)
    assert proc.returncode != 0 and "ipc" in proc.stderr


def test_compose_runs_the_gateway_on_rocm_with_prometheus_and_grafana() -> None:
    proc = compose("config", "--format", "json", config="kimi-k2.5-eagle3-mi300x")
    assert proc.returncode == 0, proc.stderr
    services = json.loads(proc.stdout)["services"]
    gateway = services["specgate"]
    assert gateway["build"]["dockerfile"] == DOCKERFILE.name and gateway["build"]["context"] == str(REPO)
    assert {d["source"] for d in gateway["devices"]} == {"/dev/kfd", "/dev/dri"}
    assert set(gateway["group_add"]) == {"video", "render"}
    assert gateway["ipc"] == "host" and int(gateway["shm_size"]) >= 8 << 30
    assert "seccomp:unconfined" in gateway["security_opt"]
    mounts = {v["target"]: v for v in gateway["volumes"]}
    assert mounts["/config/specgate.yaml"]["source"] == str(CONFIG_DIR / "kimi-k2.5-eagle3-mi300x.yaml")
    assert mounts["/config/specgate.yaml"]["read_only"] is True
    assert "/data" in mounts
    assert gateway["environment"]["HF_TOKEN"] is None, "HF_TOKEN comes from the shell, never from the file"
    assert {k: v for k, v in gateway["environment"].items() if k != "HF_TOKEN"} == STUDY["moonshotai/Kimi-K2.5"][2]
    assert [p["target"] for p in gateway["ports"]] == [8000]

    prometheus_yml = yaml.safe_load((REPO / "deploy" / "prometheus" / "prometheus.yml").read_text())
    targets = [c["targets"] for job in prometheus_yml["scrape_configs"] for c in job["static_configs"]]
    assert ["specgate:8000"] in targets, "Prometheus scrapes the compose service by name"
    prom_mounts = {v["target"]: v["source"] for v in services["prometheus"]["volumes"] if v["type"] == "bind"}
    assert prom_mounts["/etc/prometheus/prometheus.yml"] == str(REPO / "deploy" / "prometheus" / "prometheus.yml")
    assert prom_mounts["/etc/prometheus/rules.yml"] == str(REPO / "deploy" / "prometheus" / "rules.yml")

    datasources = yaml.safe_load((REPO / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text())
    assert datasources["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load((REPO / "deploy/grafana/provisioning/dashboards/specgate.yml").read_text())
    grafana_mounts = {v["target"]: v["source"] for v in services["grafana"]["volumes"]}
    assert grafana_mounts["/etc/grafana/provisioning"] == str(REPO / "deploy" / "grafana" / "provisioning")
    assert grafana_mounts[provider["providers"][0]["options"]["path"]] == str(REPO / "dashboards")
    for image in (services["prometheus"]["image"], services["grafana"]["image"]):
        assert ":" in image and not image.endswith(":latest"), image


# --------------------------------------------------------------------------- Kubernetes


@pytest.mark.parametrize("version", ["1.30.0", "1.37.0"])
def test_k8s_manifests_match_the_api_schemas(version: str) -> None:
    manifests = sorted(K8S.glob("*.yaml"))
    proc = run(tool("kubernetes-validate"), "--strict", "--quiet", "-k", version, *manifests)
    assert proc.returncode == 0, f"kubernetes-validate {version}:\n{proc.stdout}{proc.stderr}"


def test_k8s_check_is_not_vacuous(tmp_path: Path) -> None:
    broken = tmp_path / "deployment.yaml"
    broken.write_text((K8S / "deployment.yaml").read_text().replace("readinessProbe", "readynessProbe"))
    proc = run(tool("kubernetes-validate"), "--strict", "--quiet", broken)
    assert proc.returncode != 0 and "readynessProbe" in proc.stdout + proc.stderr


def test_k8s_deployment_wiring() -> None:
    deployment, service, configmap = k8s("deployment"), k8s("service"), k8s("configmap")
    pod = deployment["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}

    config_path = Path(ENTRYPOINT[ENTRYPOINT.index("--config") + 1])
    assert volumes[mounts[str(config_path.parent)]]["configMap"]["name"] == configmap["metadata"]["name"]
    assert config_path.name in configmap["data"]
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"
    assert "persistentVolumeClaim" in volumes[mounts["/data"]], "the HF cache (HF_HOME=/data/hf) persists"

    (port,) = container["ports"]
    probes = {kind: container[kind] for kind in ("startupProbe", "livenessProbe", "readinessProbe")}
    assert {kind: p["httpGet"]["path"] for kind, p in probes.items()} == {
        "startupProbe": "/health",
        "livenessProbe": "/health",
        "readinessProbe": "/ready",
    }
    assert all(p["httpGet"]["port"] == port["name"] for p in probes.values())
    startup = probes["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 3600, "engines take minutes to hours to start"

    annotations = pod["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port["containerPort"] == 8000
    assert annotations["prometheus.io/path"] == "/metrics"

    assert service["spec"]["selector"] == pod["metadata"]["labels"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == port["name"]

    config = parse_config(yaml.safe_load(configmap["data"][config_path.name]), source="configmap.yaml")
    gpus = {gpu for _, _, kwargs, _ in engines(config) for gpu in kwargs["device_ids"]}
    resources = container["resources"]
    assert resources["requests"]["amd.com/gpu"] == resources["limits"]["amd.com/gpu"] == len(gpus)
    assert gpus == set(range(len(gpus))), "device_ids index the GPUs the device plugin gave the pod"


def test_k8s_example_config_is_the_studys_qwen3_8b(tmp_path: Path) -> None:
    text = k8s("configmap")["data"]["specgate.yaml"]
    raw = yaml.safe_load(text)
    example = parse_config(raw, source="configmap.yaml")
    study = load_config(CONFIG_DIR / "qwen3-8b-mi300x.yaml")
    for name, model in example.models.items():
        reference = study.models[name]
        assert model.target == reference.target
        for method_name, method in model.methods.items():
            assert method.speculative_config == reference.methods[method_name].speculative_config, method_name
    path = tmp_path / "specgate.yaml"
    path.write_text(text)
    assert check_vllm_module().problems([path]) == []
