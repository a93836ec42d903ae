# Threadbook: `make run` starts the bot, `make test` runs the tests, `make check` runs
# strict mypy and the import-layering contracts. All create .venv (the bot) and .venv-kernel
# (what kernels run: kernels/requirements.txt, installed with uv) on first use (needs Python >= 3.11);
# `run` and `console` install only what the bot needs, `test`, `check` and `bench` add the
# test and type-checking extras (`.[test]`) to .venv.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
KERNEL_VENV ?= .venv-kernel
GATEWAY_VENV ?= .venv-gateway
KERNEL_RUNTIME := $(wildcard kernels/runtime/pyproject.toml kernels/runtime/threadbook_kernel/*.py)
CONFIG ?= config.yaml
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: run console test test-fast check bench clean venv dev-venv kernel-env gateway-env

venv: $(VENV)/.installed $(KERNEL_VENV)/.installed

dev-venv: venv $(VENV)/.installed-dev

kernel-env: $(KERNEL_VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "error: Threadbook needs Python >= 3.11 (python3.11 or newer on PATH)." >&2; exit 1; fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV) || { echo "error: could not create $(VENV); install the venv module (Debian: apt-get install python3-venv)." >&2; exit 1; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	@touch $@

# The test and type-checking extras (pytest, mypy, import-linter, stubs, pandas for the tests).
$(VENV)/.installed-dev: pyproject.toml $(VENV)/.installed
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

# The kernel environment, separate from the bot's: the bot's libraries are not importable in a kernel.
$(KERNEL_VENV)/.installed: kernels/requirements.txt $(KERNEL_RUNTIME) $(VENV)/.installed
	$(PY) -m uv venv --quiet --allow-existing --no-python-downloads --python "$$(command -v $(PYTHON))" $(KERNEL_VENV)
	$(PY) -m uv pip install --quiet --compile-bytecode --python $(KERNEL_VENV)/bin/python --reinstall-package threadbook-kernel \
		-r kernels/requirements.txt ./kernels/runtime \
		|| { echo "error: could not build the kernel environment $(KERNEL_VENV) (needs PyPI, or UV_INDEX_URL / UV_FIND_LINKS)." >&2; exit 1; }
	@touch $@

run: venv
	$(PY) -m bot run --config $(CONFIG)

console: venv
	$(PY) -m bot console --config $(CONFIG)

# A Jupyter Kernel Gateway in its own environment, for the gateway tests and bench (the
# gateway's kernels run from the kernel environment through a kernelspec the tests write).
gateway-env: $(GATEWAY_VENV)/.installed

$(GATEWAY_VENV)/.installed: $(VENV)/.installed
	$(PY) -m uv venv --quiet --allow-existing --no-python-downloads --python "$$(command -v $(PYTHON))" $(GATEWAY_VENV)
	$(PY) -m uv pip install --quiet --python $(GATEWAY_VENV)/bin/python 'jupyter-kernel-gateway>=3.0' \
		|| { echo "error: could not build the gateway environment $(GATEWAY_VENV) (needs PyPI, or UV_INDEX_URL / UV_FIND_LINKS)." >&2; exit 1; }
	@touch $@

test: dev-venv gateway-env
	$(PY) -m pytest $(PYTEST_ARGS)

# Local work: everything but the slow suites (images, benchmarks) and those that start a
# PostgreSQL or a Kernel Gateway (markers set in tests/conftest.py); CI runs `make test`.
test-fast: dev-venv
	$(PY) -m pytest -m "not slow and not postgres and not gateway" $(PYTEST_ARGS)

# Strict typing (with pydantic's plugin), the import layering, the house rules on code shape (tests/test_house.py),
# ruff's lint and format; all configured in pyproject.toml.
check: dev-venv
	$(PY) -m mypy
	cd kernels/runtime && MYPYPATH=. $(CURDIR)/$(PY) -m mypy --config-file /dev/null --strict --ignore-missing-imports --python-version 3.11 -p threadbook_kernel
	$(VENV)/bin/lint-imports --no-cache --no-logo
	$(PY) -m pytest -q -p no:cacheprovider tests/test_house.py
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: dev-venv
	$(PY) -m bench

clean:
	rm -rf $(VENV) $(KERNEL_VENV) $(GATEWAY_VENV) *.egg-info .pytest_cache
