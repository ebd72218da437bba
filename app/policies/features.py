"""Cheap features of a request that predict what speculation buys it: code or
prose, how much of the prompt repeats (what an n-gram drafter can copy), greedy or
sampled. Together they name the bucket the `auto` policy learns per (few buckets,
so that each fills quickly). The prompt's length is kept for the record; it moves
prefill time, which every method pays alike."""

from __future__ import annotations

import re
from dataclasses import dataclass

REPETITION_THRESHOLD = 0.15
# Markers that are rare in prose and common in source code.
_CODE = re.compile(r"```|^\s*(def|class|import|from|return|#include|func|fn|public|private)\b|[{};]\s*$", re.M)
_WORD = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class RequestFeatures:
    prompt_chars: int
    repetition: float  # share of the prompt's word 3-grams that occur more than once
    code: bool
    greedy: bool

    @property
    def bucket(self) -> str:
        kind = "code" if self.code else "prose"
        repeats = "repetitive" if self.repetition >= REPETITION_THRESHOLD else "varied"
        sampling = "greedy" if self.greedy else "sampled"
        return f"{kind}/{repeats}/{sampling}"


def features_of(text: str, temperature: float | None) -> RequestFeatures:
    words = _WORD.findall(text)
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    counts: dict[tuple[str, ...], int] = {}
    for gram in grams:
        counts[gram] = counts.get(gram, 0) + 1
    repeated = sum(c for c in counts.values() if c > 1)
    code_lines = len(_CODE.findall(text))
    return RequestFeatures(
        prompt_chars=len(text),
        repetition=repeated / len(grams) if grams else 0.0,
        code=code_lines >= 1,
        greedy=temperature == 0,
    )


def body_text(body: dict[str, object]) -> str:
    """The prompt text of an OpenAI or Anthropic request body, whatever its route:
    chat `messages`, completion `prompt` (token ids as words) or Responses `input`."""
    parts: list[str] = []
    for key in ("system", "instructions", "messages", "prompt", "input"):
        _collect_text(body.get(key), parts)
    return "\n".join(parts)


def _collect_text(value: object, parts: list[str]) -> None:
    if isinstance(value, str):
        parts.append(value)
    elif isinstance(value, int):
        parts.append(str(value))
    elif isinstance(value, list):
        for item in value:
            _collect_text(item, parts)
    elif isinstance(value, dict):
        for key in ("content", "text"):
            _collect_text(value.get(key), parts)
