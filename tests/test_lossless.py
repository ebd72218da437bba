"""Speculative decoding is lossless: greedy output of the n-gram engine equals
the baseline's token for token; and on copy-heavy text n-gram drafting pays."""

from __future__ import annotations

import openai
import pytest

from tests.conftest import MODEL

FRUITS = (
    "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
    "mango, nectarine, orange, papaya, quince, raspberry"
)
PROMPTS = [
    f"Repeat this list exactly: {FRUITS}.",
    "Write a short poem about the sea.",
    "Copy this code unchanged:\ndef add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n",
    "Explain in three sentences why the sky is blue.",
]


def greedy_tokens(client: openai.OpenAI, method: str, prompt: str) -> tuple[list[str], dict[str, object]]:
    completion = client.chat.completions.create(
        model=f"{MODEL}:{method}",
        messages=[{"role": "user", "content": prompt}],
        temperature=0,
        max_tokens=96,
        logprobs=True,
        top_logprobs=0,
    )
    content = completion.choices[0].logprobs.content  # type: ignore[union-attr]
    assert content is not None
    return [t.token for t in content], completion.model_extra["specgate"]


@pytest.mark.parametrize("prompt", PROMPTS, ids=["list", "poem", "code", "sky"])
def test_ngram_greedy_equals_baseline(client: openai.OpenAI, prompt: str) -> None:
    baseline, _ = greedy_tokens(client, "none", prompt)
    speculative, record = greedy_tokens(client, "ngram", prompt)
    assert len(baseline) > 5
    assert speculative == baseline
    assert record["num_spec_steps"] is not None


def test_ngram_accepts_on_repetition(client: openai.OpenAI) -> None:
    _, record = greedy_tokens(client, "ngram", PROMPTS[0])
    assert record["mean_acceptance_length"] is not None
    assert record["mean_acceptance_length"] > 1.5
