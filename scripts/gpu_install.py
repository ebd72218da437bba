"""Install specgate on a CUDA host without package-registry access, over the host's
own torch, from the wheelhouse `scripts/gpu_wheelhouse.py` built on a connected
machine. Needs only Python 3.12 (the host may have no `unzip` and no pip index).

    python3 scripts/gpu_install.py --wheelhouse /tmp/wh/wheels [more folders] --site /tmp/specgate-site
    set -a; . /tmp/specgate-site/specgate-gpu.env; set +a
    python3 -m app serve --config my-gpu-config.yaml

Each wheel is extracted into `--site` (not pip-installed: its pins, torch's above all,
would ask for what the host already has in another version); a wheel's scripts
(py-spy's binary, say) go to `--site`/bin, executable. The environment file
puts the checkout and the site on PYTHONPATH, after the host's own packages are
found first for torch (vLLM's extensions import the host's libtorch through it), and
sets what a CUDA host needs (docs/deploy.md, "A CUDA host without a registry"). Last,
it converts the embedded model (`prepare-model`) and prints torch's and vLLM's versions.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ENV = {
    "HF_HUB_OFFLINE": "1",
    # FlashInfer's sampler compiles kernels with the host's nvcc at first use (minutes).
    "VLLM_USE_FLASHINFER_SAMPLER": "0",
    # NVLink multicast is off on lent machines (and harmless to leave off elsewhere).
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def extract(wheelhouses: list[Path], site: Path) -> int:
    site.mkdir(parents=True, exist_ok=True)
    found = sorted(wheel for folder in wheelhouses for wheel in folder.glob("*.whl"))
    if not found:
        raise SystemExit(f"no wheels in {', '.join(map(str, wheelhouses))}")
    for wheel in found:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(site)
    scripts(site)
    return len(found)


def scripts(site: Path) -> None:
    """What pip would put on PATH: `<name>.data/scripts/*` to `site/bin`, executable
    (zipfile keeps no file modes)."""
    bin_dir = site / "bin"
    bin_dir.mkdir(exist_ok=True)
    for script in site.glob("*.data/scripts/*"):
        target = bin_dir / script.name
        script.replace(target)
        target.chmod(0o755)


def environment(site: Path) -> dict[str, str]:
    path = f"{site / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    return {**ENV, "PYTHONPATH": f"{REPO}:{site}", "PATH": path}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheelhouse", type=Path, nargs="+", required=True, help="the folders of wheels")
    parser.add_argument("--site", type=Path, default=Path("/tmp/specgate-site"))
    parser.add_argument("--skip-model", action="store_true", help="do not convert the embedded model")
    args = parser.parse_args()
    started = time.monotonic()
    count = extract(args.wheelhouse, args.site)
    env = environment(args.site.resolve())
    env_file = args.site / "specgate-gpu.env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in env.items()))
    print(f"{count} wheels extracted into {args.site} in {time.monotonic() - started:.0f} s; environment: {env_file}")
    run_env = {**os.environ, **env}
    check = (
        "import torch, vllm; "
        "print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'vllm', vllm.__version__)"
    )
    subprocess.run([sys.executable, "-c", check], check=True, env=run_env, cwd=REPO)
    if not args.skip_model:
        subprocess.run([sys.executable, "-m", "app", "prepare-model"], check=True, env=run_env, cwd=REPO)
    print(f"installed in {time.monotonic() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
