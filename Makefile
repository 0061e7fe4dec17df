# Two commands on a fresh machine:  `make demo`  and  `make test`.
# Both create .venv (from a system Python >= 3.11 that other uids can run,
# so the multi-uid tests work) and install npumanager into it.
PYTHON ?= $(shell for p in /usr/bin/python3.13 /usr/bin/python3.12 /usr/bin/python3.11 python3; do \
	  if command -v $$p >/dev/null 2>&1 && $$p -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then echo $$p; break; fi; done)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck check clean venv

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "need Python >= 3.11"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/npu demo

test: $(STAMP)
	$(BIN)/python -m pytest -n auto -q

lint: $(STAMP)
	$(BIN)/ruff check npumanager tests bench examples
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

check: lint typecheck test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
