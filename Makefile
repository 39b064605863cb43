# The two commands of the quick start: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip

.PHONY: run test lint bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip wheel setuptools

# Core install: numpy, click, rich, omegaconf, cloudpickle.
$(VENV)/.core: pyproject.toml | $(PY)
	$(PIP) install -e .
	touch $@

# Dev install: every extra. torch is pinned first so that nothing pulls a CUDA build.
$(VENV)/.dev: pyproject.toml | $(PY)
	$(PIP) install "torch==2.13.0"
	$(PIP) install -e ".[dev]"
	touch $@ $(VENV)/.core

run: $(VENV)/.core
	$(VENV)/bin/turnpool rollout

test: $(VENV)/.dev
	$(VENV)/bin/ruff check turnpool tests benchmarks
	$(VENV)/bin/mypy
	HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 $(VENV)/bin/pytest -q -p no:cacheprovider

lint: $(VENV)/.dev
	$(VENV)/bin/ruff check turnpool tests benchmarks
	$(VENV)/bin/mypy

bench: $(VENV)/.dev
	$(VENV)/bin/turnpool bench all

clean:
	rm -rf $(VENV) build *.egg-info
