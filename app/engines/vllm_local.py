"""An in-process vLLM `AsyncLLM` serving one (model, method).

Lifecycle: `prepare()` builds and validates the vLLM config (cheap, no process);
`start()` returns once the EngineCore process is up and has answered one tiny
request; `stop()` stops that process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from pydantic import ValidationError
from vllm import AsyncEngineArgs, SamplingParams
from vllm.config import VllmConfig
from vllm.exceptions import VLLMClientError
from vllm.renderers import ChatParams
from vllm.sampling_params import RequestOutputKind
from vllm.usage.usage_lib import UsageContext
from vllm.v1.engine.async_llm import AsyncLLM
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from app.config import ModelConfig, describe_validation_error
from app.engines.base import (
    ChatPrompt,
    EngineConfigError,
    EngineId,
    EngineInfo,
    EngineInputError,
    EngineOutput,
    EngineStats,
    EngineUnavailableError,
    Prompt,
    Sampling,
    TextPrompt,
)
from app.engines.vllm_outputs import build_record, choice_delta, spec_counts
from app.engines.vllm_stats import (
    SchedulerSnapshot,
    SilentPrometheusStatLogger,
    SnapshotStatLogger,
)
from app.metrics import SpecCounts

logger = logging.getLogger(__name__)


def build_engine_args(engine_id: EngineId, model: ModelConfig) -> AsyncEngineArgs:
    method = model.methods[engine_id.method]
    kwargs: dict[str, Any] = model.engine_for(engine_id.method).to_engine_kwargs()
    kwargs.update(
        model=model.target,
        served_model_name=[engine_id.model],
        disable_log_stats=False,  # RequestOutput.metrics is None without stats
        enable_log_requests=False,
    )
    if model.tokenizer:
        kwargs["tokenizer"] = model.tokenizer
    if method.speculative_config is not None:
        kwargs["speculative_config"] = dict(method.speculative_config)
        # Only valid with speculation: vLLM refuses it on a baseline engine.
        kwargs["per_request_spec_decode_metrics"] = "summary"
    try:
        return AsyncEngineArgs(**kwargs)
    except TypeError as exc:
        raise EngineConfigError(f"engine {engine_id}: {exc}") from None


class LocalVLLMEngine:
    def __init__(self, engine_id: EngineId, model: ModelConfig) -> None:
        self.id = engine_id
        self._model = model
        self._vllm_config: VllmConfig | None = None
        self._llm: AsyncLLM | None = None
        self._snapshot = SchedulerSnapshot()
        self.restarts = 0
        self._wanted = False
        self.info = EngineInfo.configured(engine_id, model)

    def prepare(self) -> None:
        """Let vLLM validate the whole configuration before any engine starts."""
        if self._vllm_config is not None:
            return
        args = build_engine_args(self.id, self._model)
        try:
            # A gateway is an API server: vLLM then sizes its batch limits as `vllm serve` does
            # (on a large GPU 1024 sequences / 16384 tokens instead of the library's 128 / 2048).
            self._vllm_config = args.create_engine_config(UsageContext.OPENAI_API_SERVER)
        except ValidationError as exc:
            detail = describe_validation_error(exc, f"engine {self.id}")
            raise EngineConfigError(f"vLLM rejected the configuration of {detail}") from None
        except (ValueError, TypeError, OSError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise EngineConfigError(f"vLLM rejected the configuration of engine {self.id}: {first}") from None
        spec = self._vllm_config.speculative_config
        self.info = replace(
            self.info,
            num_speculative_tokens=spec.num_speculative_tokens if spec else None,
            max_model_len=self._vllm_config.model_config.max_model_len,
        )

    async def start(self) -> None:
        self._wanted = True
        # EngineCore start-up blocks for tens of seconds: off the event loop.
        await asyncio.to_thread(self._start_blocking)
        await self.warm_up()

    def _start_blocking(self) -> None:
        if self._vllm_config is None:
            self.prepare()
        assert self._vllm_config is not None
        snapshot = self._snapshot

        def snapshot_logger(config: VllmConfig, index: int) -> SnapshotStatLogger:
            return SnapshotStatLogger(config, index, snapshot)

        logger.info("starting engine %s", self.id)
        self._llm = AsyncLLM.from_vllm_config(
            self._vllm_config,
            stat_loggers=[SilentPrometheusStatLogger, snapshot_logger],
            disable_log_stats=False,
            usage_context=UsageContext.OPENAI_API_SERVER,
        )

    async def warm_up(self) -> None:
        """One tiny request, so the first client does not pay for lazy kernel set-up
        (seconds on CPU) in its TTFT."""
        async for _ in self.generate(TextPrompt(text="Hello"), Sampling(max_tokens=2), f"warmup-{self.id}"):
            pass

    async def stop(self) -> None:
        self._wanted = False
        self.shutdown()

    def shutdown(self) -> None:
        if self._llm is not None:
            logger.info("stopping engine %s", self.id)
            self._llm.shutdown()
            self._llm = None

    @property
    def llm(self) -> AsyncLLM:
        if self._llm is None:
            raise EngineUnavailableError(f"engine {self.id} is not running")
        return self._llm

    async def health(self) -> bool:
        return self._llm is not None and not self._llm.errored

    @property
    def dead(self) -> bool:
        """Meant to run (started, not stopped), but its EngineCore is gone or a restart failed."""
        return self._wanted and (self._llm is None or self._llm.errored)

    async def restart(self) -> None:
        """Clean up what is left of a dead engine and start it again; raises if the start fails."""
        self.restarts += 1
        self.shutdown()
        await self.start()

    def stats(self) -> EngineStats:
        llm = self._llm
        return EngineStats(
            up=llm is not None and not llm.errored,
            unfinished_requests=llm.get_num_unfinished_requests() if llm else 0,
            running_requests=self._snapshot.running,
            waiting_requests=self._snapshot.waiting,
            kv_cache_usage=self._snapshot.kv_cache_usage,
            restarts=self.restarts,
        )

    async def abort(self, request_id: str) -> None:
        if self._llm is not None:
            await self._llm.abort(request_id)

    async def generate(
        self, prompt: Prompt, sampling: Sampling, request_id: str
    ) -> AsyncIterator[EngineOutput]:
        llm = self.llm
        engine_input = await self._render(llm, prompt)
        prompt_len = len(engine_input["prompt_token_ids"])
        params = self._sampling_params(sampling, prompt_len)
        spec_parts: dict[int, SpecCounts] = {}
        tokens: dict[int, int] = {}
        finish: dict[int, str] = {}
        try:
            async for out in llm.generate(engine_input, params, request_id):
                deltas = tuple(choice_delta(o, sampling.logprobs) for o in out.outputs)
                for o in out.outputs:
                    tokens[o.index] = tokens.get(o.index, 0) + len(o.token_ids)
                    if o.finish_reason is not None:
                        finish[o.index] = o.finish_reason
                    if o.spec_decode_metrics is not None:
                        spec_parts[o.index] = spec_counts(o.spec_decode_metrics)
                record = None
                if out.finished:
                    record = build_record(
                        self.info,
                        out,
                        list(spec_parts.values()),
                        sum(tokens.values()),
                        [finish[i] for i in sorted(finish)],
                    )
                yield EngineOutput(deltas, prompt_len, record)
        except VLLMClientError as exc:
            raise EngineInputError(str(exc)) from None
        except (EngineDeadError, EngineGenerateError) as exc:
            raise EngineUnavailableError(f"engine {self.id} failed: {type(exc).__name__}") from None

    async def _render(self, llm: AsyncLLM, prompt: Prompt) -> dict[str, Any]:
        try:
            if isinstance(prompt, ChatPrompt):
                kwargs = {**prompt.chat_template_kwargs, "add_generation_prompt": True}
                _, (engine_input,) = await llm.renderer.render_chat_async(
                    [prompt.messages], ChatParams(chat_template_kwargs=kwargs)
                )
            else:
                raw: dict[str, Any] = (
                    {"prompt_token_ids": prompt.token_ids}
                    if prompt.token_ids is not None
                    else {"prompt": prompt.text}
                )
                (engine_input,) = await llm.renderer.render_cmpl_async([raw])
        except VLLMClientError as exc:
            raise EngineInputError(str(exc)) from None
        except (ValueError, TypeError, KeyError) as exc:
            # Template and tokenizer errors describe the client's input.
            first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
            raise EngineInputError(f"could not render the prompt: {first}") from None
        return dict(engine_input)

    def _sampling_params(self, sampling: Sampling, prompt_len: int) -> SamplingParams:
        room = self.info.max_model_len - prompt_len
        if room <= 0:
            raise EngineInputError(
                f"the prompt has {prompt_len} tokens, but the model's context length "
                f"is {self.info.max_model_len} tokens"
            )
        max_tokens = sampling.max_tokens if sampling.max_tokens is not None else room
        if max_tokens > room:
            raise EngineInputError(
                f"max_tokens is {max_tokens}, but the prompt has {prompt_len} tokens and "
                f"the model's context length is {self.info.max_model_len} tokens "
                f"(at most {room} tokens can be generated)"
            )
        optional = {
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "top_k": sampling.top_k,
            "min_p": sampling.min_p,
            "seed": sampling.seed,
            "presence_penalty": sampling.presence_penalty,
            "frequency_penalty": sampling.frequency_penalty,
            "repetition_penalty": sampling.repetition_penalty,
            "logit_bias": sampling.logit_bias,
            "logprobs": sampling.logprobs,
            "min_tokens": sampling.min_tokens,
            "ignore_eos": sampling.ignore_eos,
        }
        try:
            return SamplingParams(
                n=sampling.n,
                max_tokens=max_tokens,
                stop=list(sampling.stop) or None,
                output_kind=RequestOutputKind.DELTA,
                **{k: v for k, v in optional.items() if v is not None},
            )
        except VLLMClientError as exc:
            raise EngineInputError(str(exc)) from None
        except ValueError as exc:
            raise EngineInputError(str(exc).strip().splitlines()[0]) from None
