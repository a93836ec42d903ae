# Threadbook: `make run` starts the bot, `make test` runs the tests, `make check` runs
# strict mypy and the import-layering contracts. All create .venv on first use (needs Python >= 3.11).
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
CONFIG ?= config.yaml
PYTHON ?= $(shell for p in python3.13 python3.12 python3.11 python3; do \
	command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null && { echo $$p; break; }; done)

.PHONY: run console test check bench clean venv

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	@if [ -z "$(PYTHON)" ]; then echo "error: Threadbook needs Python >= 3.11 (python3.11 or newer on PATH)." >&2; exit 1; fi
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV) || { echo "error: could not create $(VENV); install the venv module (Debian: apt-get install python3-venv)." >&2; exit 1; }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $@

run: venv
	$(PY) -m bot run --config $(CONFIG)

console: venv
	$(PY) -m bot console --config $(CONFIG)

test: venv
	$(PY) -m pytest $(PYTEST_ARGS)

# Strict typing (with pydantic's plugin) and the import layering; both configured in pyproject.toml.
check: venv
	$(PY) -m mypy
	$(VENV)/bin/lint-imports --no-cache --no-logo

bench: venv
	$(PY) -m bench

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
