"""`specgate bench` and `specgate tune` end to end, as a user runs them: the real
CLI against the real gateway (tune starts its own engines), then the files it
wrote are checked against each other, against the gateway's counters and
against speculative decoding's own arithmetic."""

from __future__ import annotations

import csv
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

from app.bench.report import read_jsonl
from app.config import parse_config
from tests.conftest import MODEL
from tests.support import GatewayProcess, scrape, total

PNG = b"\x89PNG\r\n\x1a\n"
PLOTS = ("throughput.png", "speedup_vs_n.png", "acceptance_heatmap.png")


def specgate(*args: str, timeout: float = 1500) -> subprocess.CompletedProcess[str]:
    run = subprocess.run([sys.executable, "-m", "app", *args], capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    return run


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def number(row: dict[str, str], key: str) -> float | None:
    return float(row[key]) if row[key] != "" else None


def check_study_arithmetic(row: dict[str, str]) -> None:
    """MAL = 1 + N·AR within rounding, and p1 + … + pN = MAL - 1 exactly."""
    mal, ar, n = number(row, "mal"), number(row, "ar"), number(row, "N")
    assert mal is not None and ar is not None and n is not None, row
    # n-gram may propose fewer than N drafts when its match runs into the end of the
    # text: drafts <= N·steps, so 1 + N·AR can only exceed MAL, and only slightly.
    assert mal <= 1 + n * ar + 1e-9
    assert mal == pytest.approx(1 + n * ar, rel=0.02)
    positions = [float(row[f"p{i}"]) for i in range(1, int(n) + 1)]
    assert sum(positions) == pytest.approx(mal - 1, abs=1e-9)
    assert positions == sorted(positions, reverse=True)  # acceptance is a prefix


def check_files(out: Path) -> None:
    for name in ("requests.jsonl", "summary.csv", "summary.md", *PLOTS):
        assert (out / name).is_file(), name
    for name in PLOTS:
        assert (out / name).read_bytes().startswith(PNG)


@pytest.fixture(scope="module")
def bench_run(gateway: GatewayProcess, http: httpx.Client, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    before = scrape(http)
    specgate(
        "bench", "--url", gateway.url, "--model", MODEL, "--workloads", "edit,chat", "--concurrency", "1,2",
        "--rate", "1", "--requests", "2", "--max-tokens", "24", "--warmup", "0", "--out", str(out),
    )  # fmt: skip
    after = scrape(http)
    (out / "counter-deltas.yaml").write_text(
        yaml.safe_dump(
            {
                method: total(after, "specgate_output_tokens_total", model=MODEL, method=method)
                - total(before, "specgate_output_tokens_total", model=MODEL, method=method)
                for method in ("none", "ngram")
            }
        )
    )
    return out


def test_bench_writes_every_file(bench_run: Path) -> None:
    check_files(bench_run)
    markdown = (bench_run / "summary.md").read_text()
    for text in ("### edit", "### chat", "| method |", "p4", "n/m", "TTFT p99 ms"):
        assert text in markdown, text


def test_bench_requests_all_answered_and_tokens_match_the_gateway_counters(bench_run: Path) -> None:
    results = read_jsonl(bench_run / "requests.jsonl")
    assert len(results) == 2 * 3 * 2 * 2  # workloads x loads x engines x requests
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    sent: dict[str, float] = defaultdict(float)
    for r in results:
        assert r.output_tokens is not None and r.output_tokens > 0
        assert r.ttft_s is not None and 0 < r.ttft_s <= r.e2e_s
        sent[r.method] += r.output_tokens
    assert yaml.safe_load((bench_run / "counter-deltas.yaml").read_text()) == dict(sent)


def test_bench_speculation_is_lossless_in_token_counts(bench_run: Path) -> None:
    counts: dict[tuple[str, str], set[int | None]] = defaultdict(set)
    for r in read_jsonl(bench_run / "requests.jsonl"):
        if str(r.load) == "c=1":
            counts[(r.workload, r.prompt_id)].add(r.output_tokens)
    assert counts and all(len(c) == 1 for c in counts.values()), counts


def test_bench_summary_is_internally_consistent(bench_run: Path) -> None:
    rows = read_csv(bench_run / "summary.csv")
    assert len(rows) == 2 * 3 * 2
    assert {row["load"] for row in rows} == {"c=1", "c=2", "rate=1/s"}
    for row in rows:
        tokens, duration, rate = (number(row, k) for k in ("output_tokens", "duration_s", "output_tokens_per_s"))
        assert tokens and duration and rate is not None
        assert rate == pytest.approx(tokens / duration)
        if row["method"] == "none":
            assert number(row, "mal") is None and number(row, "speedup") == pytest.approx(1.0)
        else:
            assert row["N"] == "4"
            check_study_arithmetic(row)
            cell = (row["workload"], row["load"])
            base = next(b for b in rows if b["method"] == "none" and (b["workload"], b["load"]) == cell)
            assert number(row, "speedup") == pytest.approx(rate / float(base["output_tokens_per_s"]))


def test_bench_replay_reproduces_the_summary(bench_run: Path, tmp_path: Path) -> None:
    specgate("bench", "--replay", str(bench_run / "requests.jsonl"), "--out", str(tmp_path))
    assert read_csv(tmp_path / "summary.csv") == read_csv(bench_run / "summary.csv")


def test_bench_unknown_target_is_a_clear_error(gateway: GatewayProcess) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "app", "bench", "--url", gateway.url, "--targets", f"{MODEL}:eagle9"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2
    assert f"unknown target(s) {MODEL}:eagle9" in run.stderr and f"{MODEL}:ngram" in run.stderr


@pytest.mark.engine  # `specgate tune` starts its own engines
def test_tune_sweeps_n_one_engine_at_a_time_and_writes_a_config(tmp_path: Path) -> None:
    out = tmp_path / "tune"
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    specgate(
        "tune", "--method", "ngram", "--n", "1,3", "--workload", "edit", "--requests", "3",
        "--max-tokens", "40", "--warmup", "1", "--out", str(out),
    )  # fmt: skip
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before]
    assert not left, f"tune left processes behind: {left}"
    check_files(out)
    rows = {row["method"]: row for row in read_csv(out / "summary.csv")}
    assert set(rows) == {"none", "ngram-n1", "ngram-n3"}
    for name in ("none", "ngram-n1", "ngram-n3"):
        assert (out / "configs" / f"{name}.yaml").is_file() and (out / "logs" / f"{name}.log").is_file()
    for name in ("ngram-n1", "ngram-n3"):
        check_study_arithmetic(rows[name])
    # The pick is by end-to-end tok/s (ties within 1% to the lower N), never by acceptance.
    rates = {int(rows[n]["N"]): float(rows[n]["output_tokens_per_s"]) for n in ("ngram-n1", "ngram-n3")}
    best = min(n for n, rate in rates.items() if rate >= max(rates.values()) * 0.99)
    snippet = yaml.safe_load((out / "tune.yaml").read_text())
    spec = snippet["models"][MODEL]["methods"]["ngram"]["speculative_config"]
    assert spec == {"method": "ngram", "num_speculative_tokens": best, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    # The snippet drops into a config as it is.
    block = snippet["models"][MODEL]
    block["methods"] = {"none": {}, **block["methods"]}  # the baseline its auto.priors name
    assert set(block["auto"]["priors"]) == {"none", "ngram"}
    best_rate = float(rows[f"ngram-n{best}"]["output_tokens_per_s"])
    assert block["auto"]["priors"]["ngram"] == pytest.approx(best_rate, rel=0.01)
    parse_config({"models": {MODEL: {"target": "x", "default_method": "ngram", **block}}})
