"""specgate's vLLM plugin (entry point `vllm.general_plugins`, loaded by every vLLM
process, engine cores included): synthetic acceptance on the CPU.

`rejection_sample_method: synthetic` accepts each draft with a set probability,
whatever the target says, so an engine behaves like a drafter of a measured
acceptance profile (docs/methods.md). vLLM runs it in its Triton rejection kernels;
its CPU build replaces those with C++ kernels that assert synthetic mode away
(vllm/utils/cpu_triton_utils.py, 0.32). This fills in that branch with the
Triton kernels' rule, in torch, before the CPU platform registers its kernels
(vLLM loads general plugins first). Everything else goes to vLLM's kernels.

vLLM loads the plugin in every vLLM process of the environment, a user's own
`vllm serve` included: it acts only where `ACTIVE` is set to 1, which the gateway
sets for the engines it starts (app/engines/vllm_local.py); anywhere else it loads
and returns."""

from __future__ import annotations

import os
from typing import Any

# Set by the gateway in its engines' environment (they inherit the gateway's).
ACTIVE = "SPECGATE_VLLM_PLUGIN"


def register() -> None:
    if os.environ.get(ACTIVE) != "1":
        return
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    from vllm.utils import cpu_triton_utils as cpu_tl

    if getattr(cpu_tl, "_specgate_synthetic", False):
        return
    greedy, random = cpu_tl._rejection_greedy_sample_kernel_impl, cpu_tl._rejection_random_sample_kernel_impl

    # Parameter names and order: the CPU kernels' own, which vLLM's dispatcher passes positionally.
    def greedy_kernel(
        output_token_ids: Any,
        cu_num_draft_tokens: Any,
        draft_token_ids: Any,
        target_argmax: Any,
        bonus_token_ids: Any,
        is_greedy: Any,
        max_spec_len: int,
        uniform_probs: Any = None,
        synthetic_conditional_rates: Any = None,
        SYNTHETIC_MODE: bool = False,
    ) -> None:
        if not SYNTHETIC_MODE:
            greedy(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                target_argmax,
                bonus_token_ids,
                is_greedy,
                max_spec_len,
            )
            return
        skip = None if is_greedy is None else [not g for g in is_greedy.tolist()]
        synthetic_accept(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            target_argmax,
            bonus_token_ids,
            uniform_probs,
            synthetic_conditional_rates,
            skip,
        )

    def random_kernel(
        output_token_ids: Any,
        cu_num_draft_tokens: Any,
        draft_token_ids: Any,
        draft_probs: Any,
        target_probs: Any,
        bonus_token_ids: Any,
        recovered_token_ids: Any,
        uniform_probs: Any,
        is_greedy: Any,
        max_spec_len: int,
        vocab_size: int,
        synthetic_conditional_rates: Any = None,
        NO_DRAFT_PROBS: bool = False,
        SYNTHETIC_MODE: bool = False,
    ) -> None:
        if not SYNTHETIC_MODE:
            random(
                output_token_ids,
                cu_num_draft_tokens,
                draft_token_ids,
                draft_probs,
                target_probs,
                bonus_token_ids,
                recovered_token_ids,
                uniform_probs,
                is_greedy,
                max_spec_len,
                vocab_size,
                NO_DRAFT_PROBS=NO_DRAFT_PROBS,
            )
            return
        synthetic_accept(
            output_token_ids,
            cu_num_draft_tokens,
            draft_token_ids,
            recovered_token_ids,
            bonus_token_ids,
            uniform_probs,
            synthetic_conditional_rates,
            is_greedy.tolist(),
        )

    cpu_tl._rejection_greedy_sample_kernel_impl = greedy_kernel
    cpu_tl._rejection_random_sample_kernel_impl = random_kernel
    cpu_tl._specgate_synthetic = True


def synthetic_accept(
    output_token_ids: Any,
    cu_num_draft_tokens: Any,
    draft_token_ids: Any,
    on_reject: Any,
    bonus_token_ids: Any,
    uniform_probs: Any,
    conditional_rates: Any,
    skip: list[bool] | None,
) -> None:
    """vLLM's synthetic rule, per request: draft i is accepted when its uniform draw
    is below the conditional rate of position i (and it is not padding, -1); the first
    rejection emits `on_reject`'s token (the target's argmax, or the recovered token
    when sampling) and ends the step; a step with every draft accepted adds the bonus."""
    ends, drafts, fallback, uniform, rates, bonus = (
        t.reshape(-1).tolist()  # flat: some arrive as [n, 1]
        for t in (cu_num_draft_tokens, draft_token_ids, on_reject, uniform_probs, conditional_rates, bonus_token_ids)
    )
    for req, end in enumerate(ends):
        if skip is not None and skip[req]:
            continue
        start = ends[req - 1] if req else 0
        for pos in range(end - start):
            draft = drafts[start + pos]
            if draft < 0 or uniform[start + pos] >= rates[pos]:
                output_token_ids[req, pos] = fallback[start + pos]
                break
            output_token_ids[req, pos] = draft
        else:
            output_token_ids[req, end - start] = bonus[req]
