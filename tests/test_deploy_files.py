"""The deployment files, without a GPU or a container engine: Dockerfile.rocm (hadolint and
its wiring), deploy/docker-compose.yml (Docker Compose's own `config`), the Kubernetes
manifests (kubernetes-validate, the API's schemas), and the study's configs in
deploy/configs (their env files, GPU assignment and values, checked against the installed
vLLM). Each external checker also gets a broken file, to show that it can fail."""

from __future__ import annotations

import dataclasses
import enum
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import pydantic
import pytest
import yaml

from app.cli import _parser, settings_from
from app.config import SpecgateConfig, load_config, parse_config

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile.rocm"
COMPOSE = REPO / "deploy" / "docker-compose.yml"
K8S = REPO / "deploy" / "k8s"
CONFIG_DIR = REPO / "deploy" / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
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
    return subprocess.run([*map(str, args)], capture_output=True, text=True, timeout=120, check=False,
                          cwd=REPO, env=env)


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
    """(model, method, engine kwargs, speculative_config) of every engine."""
    return [
        (name, method_name, model.engine_for(method_name).to_engine_kwargs(), method.speculative_config)
        for name, model in config.models.items()
        for method_name, method in model.methods.items()
    ]


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
    joined = re.sub(r"\\\n", " ", "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")
    ))
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
    allowed = [line[1:].rstrip("/") for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.startswith("!")]
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
    bad.write_text(yaml.safe_dump({"models": {"m": {
        "target": "x", "default_method": "s",
        "engine": {"extra_args": {"tool_call_parser": "qwen3_xml"}},
        "methods": {"s": {"speculative_config": spec}},
    }}}))
    found = "\n".join(check.problems([bad]))
    for expected in ("engine argument 'tool_call_parser'", "no field 'draft_tp'", "speculative method 'medusa2'"):
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
def test_config_values_are_ones_vllm_accepts(config: Path) -> None:
    from vllm import AsyncEngineArgs
    from vllm.config.speculative import SpeculativeConfig
    from vllm.reasoning import ReasoningParserManager

    engine_types = {f.name: f.type for f in dataclasses.fields(AsyncEngineArgs)}
    spec_types = {f.name: f.type for f in dataclasses.fields(SpeculativeConfig)}
    parsers = set(ReasoningParserManager.reasoning_parsers) | set(ReasoningParserManager.lazy_parsers)
    for model, method, kwargs, spec in engines(load_config(config)):
        where = f"{config.name}: {model}:{method}"
        for key, value in kwargs.items():
            assert fits(engine_types[key], value), f"{where}: {key}={value!r}"
        if "reasoning_parser" in kwargs:
            assert kwargs["reasoning_parser"] in parsers, where
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
        "startupProbe": "/health", "livenessProbe": "/health", "readinessProbe": "/ready"}
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
