"""Offline workload catalogue: builtins, user JSONL files and lookup errors (no gateway)."""

from __future__ import annotations

import ast
import json
import sysconfig
from pathlib import Path

import pytest

from app.bench.workloads import BUILTIN, Prompt, Workload, WorkloadError, from_jsonl, load_workload


def texts(workload: Workload) -> list[str]:
    return [content for prompt in workload.prompts for _, content in prompt.messages]


def fenced_code(text: str) -> str:
    return text.split("```python\n", 1)[1].rsplit("\n```", 1)[0]


@pytest.mark.parametrize("name", sorted(BUILTIN))
@pytest.mark.parametrize("count", [5, 40])
def test_builtin_shape(name: str, count: int) -> None:
    workload = BUILTIN[name](count, 0)
    assert workload.name == name
    assert workload.description
    assert len(workload.prompts) == count
    assert len({p.id for p in workload.prompts}) == count
    for prompt in workload.prompts:
        assert prompt.workload == name
        assert prompt.messages
        for role, content in prompt.messages:
            assert role in {"system", "user", "assistant"}
            assert isinstance(content, str)
            assert content.strip()


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_same_seed_same_workload(name: str) -> None:
    assert BUILTIN[name](12, 7) == BUILTIN[name](12, 7)
    assert load_workload(name, 12, 7) == BUILTIN[name](12, 7)


@pytest.mark.parametrize("name", ["math", "edit"])
def test_different_seed_different_prompts(name: str) -> None:
    assert texts(BUILTIN[name](10, 0)) != texts(BUILTIN[name](10, 1))


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_count_beyond_pool_cycles_with_unique_ids(name: str) -> None:
    workload = BUILTIN[name](400, 0)
    assert len(workload.prompts) == 400
    assert len({p.id for p in workload.prompts}) == 400


def test_code_prompts_are_humaneval() -> None:
    workload = BUILTIN["code"](40, 0)
    for prompt in workload.prompts:
        assert prompt.id.startswith("HumanEval/")
        text = prompt.messages[0][1]
        assert text.startswith("Complete this Python function:\n\n")
        assert "def " in text


def test_edit_prompts_hold_real_stdlib_functions() -> None:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    instructions = set()
    for prompt in BUILTIN["edit"](40, 3).prompts:
        text = prompt.messages[0][1]
        instructions.add(text.split("\n", 1)[0])
        snippet = fenced_code(text)
        tree = ast.parse(snippet)
        assert len(tree.body) == 1
        assert isinstance(tree.body[0], ast.FunctionDef)
        assert 10 <= len(snippet.splitlines()) <= 40
        module, rest = prompt.id.split(".", 1)
        assert tree.body[0].name == rest.split(":", 1)[0]
        assert snippet in (stdlib / f"{module}.py").read_text(encoding="utf-8")
    assert any(i.startswith("Rewrite this function, renaming the parameter") for i in instructions)
    assert "Copy this function unchanged:" in instructions


def test_math_prompts_ask_for_reasoning_and_vary_templates() -> None:
    workload = BUILTIN["math"](40, 0)
    assert all("step by step" in text for text in texts(workload))
    assert len({p.id.rsplit("-", 1)[1] for p in workload.prompts}) >= 6


def test_chat_has_at_least_24_distinct_prompts() -> None:
    assert len(set(texts(BUILTIN["chat"](24, 0)))) == 24


def test_to_openai() -> None:
    prompt = Prompt(workload="w", id="1", messages=(("system", "Be brief."), ("user", "Hi")))
    assert prompt.to_openai() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


def write_lines(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_from_jsonl_accepts_prompt_and_messages(tmp_path: Path) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]
    path = write_lines(
        tmp_path / "mine.jsonl",
        json.dumps({"prompt": "Say hi.", "id": "greet"}),
        "",
        json.dumps({"messages": messages}),
        json.dumps({"prompt": "Count to three.", "id": 7}),
    )
    workload = from_jsonl(path)
    assert workload.name == "mine"
    assert [p.id for p in workload.prompts] == ["greet", "mine-3", "7"]
    assert workload.prompts[0].to_openai() == [{"role": "user", "content": "Say hi."}]
    assert workload.prompts[1].to_openai() == messages
    assert from_jsonl(path, name="custom").prompts[0].workload == "custom"


@pytest.mark.parametrize(
    "bad",
    [
        "not json",
        json.dumps(["a list"]),
        json.dumps({"id": "x"}),
        json.dumps({"prompt": ""}),
        json.dumps({"prompt": "a", "messages": [{"role": "user", "content": "b"}]}),
        json.dumps({"messages": []}),
        json.dumps({"messages": [{"role": "robot", "content": "b"}]}),
        json.dumps({"messages": [{"role": "user"}]}),
        json.dumps({"prompt": "a", "id": 1.5}),
        json.dumps({"prompt": "dup", "id": "first"}),
    ],
)
def test_from_jsonl_reports_bad_line(tmp_path: Path, bad: str) -> None:
    path = write_lines(tmp_path / "bad.jsonl", json.dumps({"prompt": "fine", "id": "first"}), "", bad)
    with pytest.raises(WorkloadError, match=r"bad\.jsonl:3: "):
        from_jsonl(path)


def test_from_jsonl_missing_or_empty_file(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"missing\.jsonl"):
        from_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(WorkloadError, match="no prompts"):
        from_jsonl(write_lines(tmp_path / "empty.jsonl", ""))


def test_load_workload_from_path_cycles_to_count(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "two.jsonl", json.dumps({"prompt": "a"}), json.dumps({"prompt": "b"}))
    workload = load_workload(str(path), 5)
    assert [p.id for p in workload.prompts] == ["two-1", "two-2", "two-1#2", "two-2#2", "two-1#3"]
    assert [p.id for p in load_workload(str(path), 1).prompts] == ["two-1"]


def test_unknown_workload_lists_builtins() -> None:
    with pytest.raises(WorkloadError) as info:
        load_workload("nonsense", 5)
    message = str(info.value)
    assert "nonsense" in message
    for name in BUILTIN:
        assert name in message


def test_count_must_be_positive() -> None:
    with pytest.raises(WorkloadError, match="count"):
        load_workload("chat", 0)
