"""specgate's vLLM plugin (app/engines/vllm_plugin.py): installed where vLLM looks
for it, and its synthetic acceptance rule is the Triton kernels' one. The engines
that run it end to end are in tests/test_synthetic.py."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch

from app.engines.vllm_plugin import ACTIVE, synthetic_accept

PLACEHOLDER = -1


def run(
    drafts: list[list[int]], uniform: list[list[float]], rates: list[float], skip: list[bool] | None = None
) -> list[list[int]]:
    n = len(rates)
    ends = torch.tensor([sum(len(d) for d in drafts[: i + 1]) for i in range(len(drafts))], dtype=torch.int32)
    flat = torch.tensor([t for d in drafts for t in d], dtype=torch.int32)
    on_reject = flat + 1000  # the target's token at each position: told apart from the draft
    out = torch.full((len(drafts), n + 1), PLACEHOLDER, dtype=torch.int32)
    bonus = torch.tensor([[9000 + i] for i in range(len(drafts))])
    synthetic_accept(
        out,
        ends,
        flat,
        on_reject,
        bonus,
        torch.tensor([u for us in uniform for u in us], dtype=torch.float64),
        torch.tensor(rates),
        skip,
    )
    return out.tolist()


def test_the_plugin_is_registered_for_vllm() -> None:
    found = {e.name: e.value for e in entry_points(group="vllm.general_plugins")}
    assert found.get("specgate_cpu_synthetic") == "app.engines.vllm_plugin:register"


def test_accepts_below_the_rate_and_stops_at_the_first_rejection() -> None:
    rates = [0.9, 0.5, 0.2]
    out = run([[11, 12, 13], [21, 22, 23], [31, 32, 33]], [[0.1, 0.4, 0.1], [0.1, 0.6, 0.0], [0.95, 0.0, 0.0]], rates)
    assert out[0] == [11, 12, 13, 9000]  # every draft accepted: the bonus follows
    assert out[1] == [21, 1022, PLACEHOLDER, PLACEHOLDER]  # rejected at position 2: the target's token, then stop
    assert out[2] == [1031, PLACEHOLDER, PLACEHOLDER, PLACEHOLDER]


def test_padding_is_rejected_and_skipped_requests_are_untouched() -> None:
    out = run([[11, -1], [21, 22]], [[0.0, 0.0], [0.0, 0.0]], [1.0, 1.0], skip=[False, True])
    assert out[0] == [11, 999, PLACEHOLDER]  # -1 is padding: never accepted
    assert out[1] == [PLACEHOLDER] * 3


def test_requests_with_fewer_drafts_than_n() -> None:
    out = run([[11], [21, 22, 23]], [[0.0], [0.0, 0.0, 0.0]], [1.0, 1.0, 1.0])
    assert out[0] == [11, 9000, PLACEHOLDER, PLACEHOLDER]
    assert out[1] == [21, 22, 23, 9001]


def test_register_replaces_the_cpu_kernels_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm.utils import cpu_triton_utils as cpu_tl

    from app.engines.vllm_plugin import register

    monkeypatch.setenv(ACTIVE, "1")  # as in an engine the gateway started
    register()
    greedy = cpu_tl._rejection_greedy_sample_kernel_impl
    assert greedy.__qualname__ == "register.<locals>.greedy_kernel"
    register()  # vLLM loads plugins in every process, and may load them twice in one
    assert cpu_tl._rejection_greedy_sample_kernel_impl is greedy


PROBE = """
from vllm.plugins import load_general_plugins
from vllm.utils import cpu_triton_utils as cpu_tl
load_general_plugins()
print("patched" if getattr(cpu_tl, "_specgate_synthetic", False) else "untouched")
"""


@pytest.mark.parametrize(("active", "expected"), [(None, "untouched"), ("1", "patched")])
def test_the_plugin_acts_only_in_the_gateways_engines(active: str | None, expected: str) -> None:
    # Any vLLM process of this environment loads the plugin (a user's own `vllm serve`
    # too): it must leave vLLM alone unless the gateway started that process.
    env = {k: v for k, v in os.environ.items() if k != ACTIVE}
    if active is not None:
        env[ACTIVE] = active
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == expected
