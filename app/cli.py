"""`specgate serve | bench | tune | check-config | vllm-command | prepare-model | make-drafter`:
argv -> settings -> action."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from app.bench.args import BenchError, add_bench_args, add_tune_args
from app.config import ConfigError, Settings, SpecgateConfig, load_config

if TYPE_CHECKING:
    from rich.console import Console

logger = logging.getLogger("specgate")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specgate", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("serve", "start the gateway and its engines"),
        ("check-config", "validate a config, including every engine's vLLM config, without starting engines"),
        ("tune", "sweep N for one method: one engine per N, one at a time; print the curve and the best config"),
        ("vllm-command", "print the `vllm serve` line that serves one method of the config (for a remote engine)"),
    ):
        cmd = sub.add_parser(name, help=help_text)
        cmd.add_argument("--config", type=Path, help="YAML config (default: the embedded SmolLM2 demo)")
        cmd.add_argument("--cache-dir", type=Path, help="where the embedded model is converted to")
        cmd.add_argument("--log-level", help="debug, info, warning, error")
        if name == "serve":
            cmd.add_argument("--host", help="bind address (default 127.0.0.1)")
            cmd.add_argument("--port", type=int, help="port (default 8000)")
            cmd.add_argument(
                "--api-processes",
                type=int,
                help="API processes over the same engines, as `vllm serve --api-server-count` (default 1)",
            )
        if name == "tune":
            add_tune_args(cmd)
        if name == "vllm-command":
            cmd.add_argument("engine", help="<model>:<method>, e.g. smollm2:ngram")
    add_bench_args(sub.add_parser("bench", help="load-test a gateway or any OpenAI-compatible server"))
    prep = sub.add_parser("prepare-model", help="convert the embedded model once and print its folder")
    prep.add_argument("--cache-dir", type=Path)
    make = sub.add_parser("make-drafter", help="write a small random drafter of a target and print its folder")
    make.add_argument(
        "kind",
        help="eagle3[-probe], dflash[-probe], draft-model[-probe], dspark, or "
        "mimo-mtp[-probe]: a target with an MTP layer (docs/methods.md)",
    )
    make.add_argument("--target", default="embedded:smollm2", help="a local HF model folder, or embedded:smollm2")
    make.add_argument("--cache-dir", type=Path)
    make.add_argument("--seed", type=int, default=0)
    return parser


def settings_from(args: argparse.Namespace) -> Settings:
    flags = {
        key: getattr(args, key)
        for key in ("host", "port", "config", "cache_dir", "log_level", "api_processes")
        if getattr(args, key, None) is not None
    }
    return Settings(**flags)  # flags win over SPECGATE_* variables


def read_config(settings: Settings) -> SpecgateConfig:
    from app.embedded import resolve_embedded_targets

    if settings.config is not None:
        config = load_config(settings.config)
    else:
        default = resources.files("app").joinpath("default_config.yaml")
        with resources.as_file(default) as path:
            config = load_config(path)
    return resolve_embedded_targets(config, settings.cache_dir)


def _serve(settings: Settings, config: SpecgateConfig) -> int:
    processes = settings.api_processes or config.server.api_processes
    if processes > 1:
        from app.frontends import serve_processes

        return serve_processes(settings, config, processes)

    from app.api.app import build_app
    from app.server import run

    app = build_app(config, settings)
    # Fail on a bad engine config here, with one line, before uvicorn starts.
    app.state.gateway.pool.prepare()
    run(app, host=settings.host, port=settings.port, log_level=settings.log_level.lower())
    return 0


def _check(config: SpecgateConfig) -> int:
    from app.engines.pool import EnginePool

    pool = EnginePool(config)
    pool.prepare()
    for engine in pool:
        info = engine.info
        print(f"ok  {info.id}  method={info.speculative_method}  N={info.num_speculative_tokens}")
    return 0


def _vllm_command(engine: str, config: SpecgateConfig) -> int:
    import shlex

    from app.engines.vllm_command import serve_args

    name, _, method = engine.partition(":")
    model = config.models.get(name)
    if model is None or method not in model.methods:
        known = ", ".join(f"{m}:{k}" for m, cfg in config.models.items() for k in cfg.methods)
        raise ConfigError(f"no engine '{engine}' (engines: {known})")
    print(shlex.join(["vllm", "serve", *serve_args(name, model, method)]))
    return 0


def _console() -> Console:
    from rich.console import Console

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one INFO line per request would bury the progress bar

    # Logs and CI are no terminal: rich would squeeze the study table into 80 columns.
    return Console(width=None if sys.stdout.isatty() else 200)


def _bench(args: argparse.Namespace) -> int:
    from app.bench.commands import bench_command

    return bench_command(args, _console())


def _tune(args: argparse.Namespace, config: SpecgateConfig) -> int:
    from app.bench.commands import tune_command, tune_plan

    return tune_command(tune_plan(args, config), _console())


def _make_drafter(args: argparse.Namespace, settings: Settings) -> int:
    from app.drafters import generated_drafter
    from app.embedded import resolve_embedded

    target = Path(resolve_embedded(args.target, "--target", settings.cache_dir))
    if not (target / "config.json").exists():
        raise ValueError(f"--target: no config.json in {target}")
    print(generated_drafter(target, args.kind, settings.cache_dir, seed=args.seed))
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Nothing is fetched from a model hub unless the operator says so.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        settings = settings_from(args)
        logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
        if args.command == "bench":
            return _bench(args)
        if args.command == "prepare-model":
            from app.embedded import ensure_embedded_model

            print(ensure_embedded_model(settings.cache_dir))
            return 0
        if args.command == "make-drafter":
            return _make_drafter(args, settings)
        config = read_config(settings)
        if args.command == "check-config":
            return _check(config)
        if args.command == "tune":
            return _tune(args, config)
        if args.command == "vllm-command":
            return _vllm_command(args.engine, config)
        return _serve(settings, config)
    except ConfigError as exc:
        print(f"specgate: config error: {exc}", file=sys.stderr)
        return 2
    except (BenchError, ValueError) as exc:  # EngineConfigError, WorkloadError and settings errors
        print(f"specgate: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
