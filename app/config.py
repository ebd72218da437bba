"""Typed configuration: process settings (CLI flags and SPECGATE_* environment) and
the YAML file of served models, each with its named speculative methods.

Nothing is read at import time; `load_config` turns a file into a validated
`SpecgateConfig` or raises `ConfigError` with one line naming the key path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import httpx
import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

BASELINE_METHOD = "none"
# Routes of a model that a policy resolves to one of its methods (docs/auto.md).
POLICY_ROUTES = ("auto", "ab")
SYNTHETIC = "synthetic"  # must be in the name of a method with synthetic acceptance


class ConfigError(ValueError):
    """The configuration cannot be used; the message names the key and the problem."""


class Settings(BaseSettings):
    """Process-level settings: CLI flags override SPECGATE_* environment variables."""

    model_config = SettingsConfigDict(env_prefix="SPECGATE_", extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    config: Path | None = None
    cache_dir: Path = Path.home() / ".cache" / "specgate"
    log_level: str = "info"
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0, description="Larger request bodies get a 413.")
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="On SIGTERM, how long in-flight requests may take to finish."
    )
    # Security (docs/operations.md). No keys: the API is open, as for a local demo.
    api_keys: str | None = Field(default=None, description="Comma-separated bearer keys for the API.")
    api_keys_file: Path | None = Field(default=None, description="A file of API keys, one per line.")
    admin_keys: str | None = Field(default=None, description="Comma-separated keys of the admin scope.")
    admin_keys_file: Path | None = None
    metrics_port: int | None = Field(
        default=None, ge=1, le=65535, description="Serve /metrics on this port only (not on the API port)."
    )
    metrics_require_key: bool = Field(default=False, description="/metrics on the API port needs an API key.")
    cors_origins: str | None = Field(default=None, description="Comma-separated origins allowed by CORS; off if unset.")
    api_processes: int | None = Field(
        default=None, ge=1, description="API processes over the same engines (default: the config's server block, 1)."
    )

    def keys(self, scope: str) -> frozenset[str]:
        """The keys of a scope ("api" or "admin"): the variable's list plus the file's lines."""
        if scope == "api":
            inline, file = self.api_keys, self.api_keys_file
        else:
            inline, file = self.admin_keys, self.admin_keys_file
        found = [k.strip() for k in (inline or "").split(",")]
        if file is not None:
            try:
                found += [line.strip() for line in file.read_text().splitlines()]
            except OSError as exc:
                raise ConfigError(f"{scope}_keys_file {file}: cannot read: {exc.strerror}") from None
        return frozenset(k for k in found if k and not k.startswith("#"))


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineSettings(_Strict):
    """vLLM engine arguments shared by a model's engines (a method may override any)."""

    max_model_len: int | None = Field(default=None, gt=0)
    dtype: str | None = None
    tensor_parallel_size: int | None = Field(default=None, gt=0)
    gpu_memory_utilization: float | None = Field(default=None, gt=0, le=1)
    kv_cache_memory_bytes: int | None = Field(default=None, gt=0)
    device_ids: list[int] | None = None
    enforce_eager: bool | None = None
    max_num_seqs: int | None = Field(default=None, gt=0)
    seed: int | None = None
    extra_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further AsyncEngineArgs fields, passed to vLLM unchanged.",
    )

    @field_validator("extra_args")
    @classmethod
    def _no_serving_flags(cls, extra: dict[str, Any]) -> dict[str, Any]:
        # A serving flag here would reach `vllm serve` twice (once from serving:), and
        # the engine gets the reasoning parser from serving: anyway.
        misplaced = sorted(set(extra) & set(ServingSettings.model_fields))
        if misplaced:
            raise ValueError(f"{', '.join(misplaced)} is a serving flag: set it under the model's serving:")
        return extra

    def merged(self, override: EngineSettings) -> EngineSettings:
        """`override`'s explicitly set fields win; extra_args merge key by key."""
        data = self.model_dump(exclude_unset=True)
        over = override.model_dump(exclude_unset=True)
        extra = {**data.pop("extra_args", {}), **over.pop("extra_args", {})}
        return EngineSettings(**{**data, **over, "extra_args": extra})

    def to_engine_kwargs(self) -> dict[str, Any]:
        kwargs = {k: v for k, v in self.model_dump(exclude={"extra_args"}).items() if v is not None}
        return {**kwargs, **self.extra_args}


class ServingSettings(_Strict):
    """vLLM's serving flags for a model (what `vllm serve` takes besides engine
    arguments): the tool and reasoning parsers, the chat template and the like. Every
    engine of the model builds vLLM's own OpenAI serving layer with them, and
    `specgate check-config` has vLLM's own argument parser check them."""

    tool_call_parser: str | None = None
    enable_auto_tool_choice: bool | None = None
    reasoning_parser: str | None = None
    chat_template: str | None = Field(default=None, description="A file or the template itself.")
    chat_template_content_format: Literal["auto", "string", "openai"] | None = None
    default_chat_template_kwargs: dict[str, Any] | None = None
    response_role: str | None = None
    served_model_name: list[str] | None = Field(
        default=None, description="Further names clients may send as `model` for this model (aliases)."
    )
    extra_args: dict[str, Any] = Field(
        default_factory=dict, description="Further `vllm serve` serving flags, by their argument name."
    )

    def to_flags(self) -> dict[str, Any]:
        """Set fields as `vllm serve` arguments (served_model_name is specgate's routing, not a flag here)."""
        data = self.model_dump(exclude={"extra_args", "served_model_name"}, exclude_none=True)
        return {**data, **self.extra_args}


class Limits(_Strict):
    """What the gateway lets into one engine, and for how long (a method may override
    any field of its model's)."""

    max_in_flight: int = Field(default=256, gt=0, description="Requests at the engine at once.")
    max_queued: int = Field(
        default=256, ge=0, description="Requests waiting at the gateway for a place; beyond them a 429."
    )
    retry_after_s: int = Field(default=1, ge=0, description="The Retry-After of a 429.")
    idle_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="Longest wait for the engine's next output (a remote engine's whole non-streamed answer).",
    )
    total_timeout_s: float | None = Field(
        default=None, gt=0, description="Longest a whole request may take, its wait for a place included."
    )

    def merged(self, override: Limits) -> Limits:
        return Limits(**{**self.model_dump(exclude_unset=True), **override.model_dump(exclude_unset=True)})

    def shared_by(self, processes: int) -> Limits:
        """One API process's share when `processes` serve the engine: the host's limits
        divided, rounded down (at least one place each), so all together admit no more."""
        if processes == 1:
            return self
        return self.model_copy(
            update={
                "max_in_flight": max(1, self.max_in_flight // processes),
                "max_queued": self.max_queued // processes,
            }
        )


class UpstreamSettings(_Strict):
    """How the gateway talks to a remote engine (a method with `url:`)."""

    served_model_name: str | None = Field(
        default=None, description="The upstream's model name; default: the only model it lists."
    )
    api_key_env: str | None = Field(
        default=None, description="Environment variable holding the upstream's API key (Bearer)."
    )
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=256, gt=0)
    probe_interval_s: float = Field(default=5.0, gt=0, description="Health and load probe period.")


class MethodConfig(_Strict):
    """One engine of a model: its speculative_config (None = baseline) and overrides,
    or, with `url`, a remote vLLM server that runs it (`speculative_config` then
    says what that server runs, for the labels)."""

    speculative_config: dict[str, Any] | None = None
    engine: EngineSettings = Field(default_factory=EngineSettings)
    url: str | None = Field(
        default=None, description="Base URL of an OpenAI-compatible vLLM server serving this method."
    )
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    limits: Limits = Field(default_factory=Limits)

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            url = httpx.URL(value)
        except httpx.InvalidURL:
            url = httpx.URL()
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"url '{value}' must be an http:// or https:// URL with a host")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _remote_or_local(self) -> MethodConfig:
        if self.url is not None and "engine" in self.model_fields_set:
            raise ValueError("'engine' settings do not apply to a remote method (url): set them on its vllm serve")
        if self.url is None and "upstream" in self.model_fields_set:
            raise ValueError("'upstream' settings need a 'url'")
        return self

    @property
    def remote(self) -> bool:
        return self.url is not None

    @field_validator("speculative_config")
    @classmethod
    def _has_method(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        # vLLM guesses the method from the draft's name when it is missing:
        # a guess is not something to deploy.
        if value is not None and "method" not in value:
            raise ValueError("speculative_config needs an explicit 'method'")
        return value

    @property
    def speculative_method(self) -> str:
        if self.speculative_config is None:
            return BASELINE_METHOD
        return str(self.speculative_config["method"])

    @property
    def num_speculative_tokens(self) -> int | None:
        if self.speculative_config is None:
            return None
        value = self.speculative_config.get("num_speculative_tokens")
        return int(value) if value is not None else None

    @property
    def synthetic(self) -> bool:
        """Drafts accepted at set rates, whatever the target says: fast or slow
        like a given drafter, but the output is not the target's (not lossless)."""
        return (self.speculative_config or {}).get("rejection_sample_method") == "synthetic"


def _positive_values(values: dict[str, float], what: str, unit: str = "") -> dict[str, float]:
    for method, value in values.items():
        if value <= 0:
            raise ValueError(f"{what} of '{method}' must be > 0{unit}")
    return values


class AutoConfig(_Strict):
    """The `auto` policy of a model: per request, the method with the highest expected
    tokens/s (or lowest inter-token latency), learnt from the records (docs/auto.md)."""

    methods: list[str] | None = Field(default=None, description="Candidates; default: every method.")
    objective: Literal["throughput", "latency"] = Field(
        default="throughput",
        description="throughput: output tokens/s of the whole request; latency: decode tokens/s (1 / ITL).",
    )
    exploration: float = Field(default=0.05, ge=0, le=0.5, description="Share of requests sent to a non-best method.")
    min_samples: int = Field(default=3, ge=1, description="Records a cell needs before its estimate counts.")
    memory: int = Field(default=50, ge=1, description="Estimates average over about this many recent records.")
    priors: dict[str, float] = Field(
        default_factory=dict, description="Cold-start tokens/s per method, e.g. from `specgate tune`."
    )
    fallback: str | None = Field(default=None, description="Method while nothing is known; default: the baseline.")
    shared_device: bool = Field(
        default=True,
        description="The engines share one device (CPU, or the same GPUs): each is judged at the model's total "
        "load, a busy device keeps its running method unless another is `switch_margin` better, and measured "
        "methods are explored only while the device is idle. false when each engine has GPUs of its own.",
    )
    switch_margin: float = Field(
        default=0.05, ge=0, le=1, description="On a busy shared device, how much better another method must be."
    )
    load_window_s: float = Field(
        default=10.0,
        ge=0,
        description="A request is expected to meet at least the mean load that the requests "
        "ended within this many seconds met over their lives (0: the load when it arrives).",
    )
    seed: int | None = Field(default=None, description="Seed of the exploration draws (tests, benchmarks).")

    @field_validator("priors")
    @classmethod
    def _positive(cls, priors: dict[str, float]) -> dict[str, float]:
        return _positive_values(priors, "prior", " tokens/s")


class ABConfig(_Strict):
    """The `ab` policy: fixed weights across methods, sticky per `user` when given."""

    weights: dict[str, float] = Field(min_length=1)
    sticky: bool = Field(default=True, description="The same `user` always gets the same method.")
    seed: int | None = None

    @field_validator("weights")
    @classmethod
    def _positive(cls, weights: dict[str, float]) -> dict[str, float]:
        return _positive_values(weights, "weight")


class ShadowConfig(_Strict):
    """Mirror a share of a model's requests to a candidate method; the client only
    sees the primary's answer, the shadow's record only reaches metrics and `auto`."""

    method: str
    share: float = Field(gt=0, le=1)
    max_in_flight: int = Field(default=2, gt=0, description="Shadow requests at once; beyond, mirrors are dropped.")
    start: Literal["concurrent", "after_primary"] = Field(
        default="concurrent",
        description="after_primary: mirror once the primary has answered (engines sharing one device).",
    )
    seed: int | None = None


class ModelConfig(_Strict):
    """A served model: one target checkpoint, several engines (one per method)."""

    target: str = Field(description="Local folder or hub id of the target model.")
    tokenizer: str | None = None
    engine: EngineSettings = Field(default_factory=EngineSettings)
    serving: ServingSettings = Field(default_factory=ServingSettings)
    limits: Limits = Field(default_factory=Limits)
    methods: dict[str, MethodConfig] = Field(min_length=1)
    default_method: str
    auto: AutoConfig | None = None
    ab: ABConfig | None = None
    shadow: ShadowConfig | None = None

    @field_validator("methods")
    @classmethod
    def _method_names(cls, methods: dict[str, MethodConfig]) -> dict[str, MethodConfig]:
        for name in methods:
            _check_name(name, "method")
            if name in POLICY_ROUTES:
                raise ValueError(f"method name '{name}' is reserved for the {name} policy")
            # The name is the method label of every response, series and panel:
            # that is what keeps a synthetic engine's figures from passing for real ones.
            if methods[name].synthetic and SYNTHETIC not in name:
                raise ValueError(
                    f"method '{name}' has rejection_sample_method 'synthetic' (output not lossless): "
                    f"its name must say so, e.g. '{name}-{SYNTHETIC}'"
                )
        return methods

    @model_validator(mode="after")
    def _references_exist(self) -> ModelConfig:
        if self.default_method not in (*self.methods, *self.policies):
            known = ", ".join([*sorted(self.methods), *self.policies])
            raise ValueError(f"default_method '{self.default_method}' is not one of the methods ({known})")
        named: list[tuple[str, list[str]]] = []
        if self.auto is not None:
            named += [
                ("auto.methods", self.auto.methods or []),
                ("auto.priors", list(self.auto.priors)),
                ("auto.fallback", [self.auto.fallback] if self.auto.fallback else []),
            ]
        if self.ab is not None:
            named.append(("ab.weights", list(self.ab.weights)))
        if self.shadow is not None:
            named.append(("shadow.method", [self.shadow.method]))
        for key, methods in named:
            for method in methods:
                if method not in self.methods:
                    raise ValueError(f"{key}: '{method}' is not one of the methods ({', '.join(sorted(self.methods))})")
        return self

    @property
    def policies(self) -> list[str]:
        """The policy routes this model has (`<model>:auto`, `<model>:ab`)."""
        return [name for name in POLICY_ROUTES if getattr(self, name) is not None]

    def engine_for(self, method: str) -> EngineSettings:
        return self.engine.merged(self.methods[method].engine)

    def limits_for(self, method: str) -> Limits:
        return self.limits.merged(self.methods[method].limits)


class ServerConfig(_Strict):
    """The gateway process itself (a flag or SPECGATE_* variable overrides each field)."""

    api_processes: int = Field(
        default=1,
        ge=1,
        description="API processes that serve the whole API over the same engines (`vllm serve --api-server-count`).",
    )


class SpecgateConfig(_Strict):
    """The whole file: the served models by name, and the server's own settings."""

    models: dict[str, ModelConfig] = Field(min_length=1)
    server: ServerConfig = Field(default_factory=ServerConfig)

    @field_validator("models")
    @classmethod
    def _model_names(cls, models: dict[str, ModelConfig]) -> dict[str, ModelConfig]:
        for name in models:
            _check_name(name, "model")
        taken = set(models)
        for name, model in models.items():
            for alias in model.serving.served_model_name or ():
                _check_name(alias, f"{name}.serving.served_model_name")
                if alias in taken:
                    raise ValueError(f"{name}.serving.served_model_name: '{alias}' already names a model")
                taken.add(alias)
        return models

    def aliases(self) -> dict[str, str]:
        """Further names of each model (`serving.served_model_name`) → the model."""
        return {alias: name for name, m in self.models.items() for alias in m.serving.served_model_name or ()}


def _check_name(name: str, what: str) -> None:
    # ':' separates model and method in the OpenAI `model` field.
    if not name or ":" in name or name != name.strip():
        raise ValueError(f"{what} name '{name}' must be non-empty, without ':' or spaces")


def load_config(path: Path) -> SpecgateConfig:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(raw, source=str(path))


def parse_config(raw: Any, source: str = "config") -> SpecgateConfig:
    if not isinstance(raw, dict):
        raise ConfigError(f"{source}: the top level must be a mapping with a 'models' key")
    try:
        return SpecgateConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, source)) from None


def describe_validation_error(exc: ValidationError, source: str) -> str:
    """One line: the first error's dotted key path and message (+ how many more)."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    key = ".".join(str(part) for part in first["loc"]) or "(top level)"
    message = first["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{source}: {key}: {message}{more}"
