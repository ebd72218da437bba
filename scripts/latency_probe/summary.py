"""Medians of the latency probe's rows (scripts/latency_probe/sitecustomize.py), per
API process, past each one's first four requests (the warm-up)."""

import json
import statistics
import sys
from pathlib import Path

NAMES = ("way in", "engine first", "cadence", "way out", "writes")


def main() -> None:
    for path in sorted(Path(sys.argv[1]).glob("*.json")):
        data = json.loads(path.read_text())
        rows = data["rows"][4:]
        server = "specgate" if " app serve" in data["argv"] else "vllm serve"
        medians = ", ".join(f"{name} {statistics.median(r[i] for r in rows):.2f}" for i, name in enumerate(NAMES))
        print(f"{server} (pid {path.stem}, {len(rows)} requests): {medians} ms")


if __name__ == "__main__":
    main()
