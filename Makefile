# Two commands do all set-up on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: run test test-fast check bench lint clean-data

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $(STAMP)

## Start everything (embedded Postgres + Valkey unless DATABASE_URL / REDIS_URL are set).
run: $(STAMP)
	$(PY) -m sentinel.run

## The whole test suite against real embedded servers.
test: $(STAMP)
	$(PY) -m pytest

## The tests that need no server (no PostgreSQL, Valkey, gateway or subprocess) and are not slow:
## under a minute. The URLs point nowhere, so the settings start no embedded server either.
test-fast: $(STAMP)
	DATABASE_URL=postgres://fast@127.0.0.1:9/fast REDIS_URL=redis://127.0.0.1:9/0 \
		$(PY) -m pytest -m "not servers and not slow" -q

## Every benchmark scenario (bench/README.md); one alone: make bench SCENARIO=overhead [ARGS="--quick"]
bench: $(STAMP)
	$(PY) -m bench $(SCENARIO) $(ARGS)

## Lint, format check and type check (what CI runs before the tests). Dummy URLs: the type
## checker's Django plugin loads the settings, which would otherwise start the embedded servers.
check: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DATABASE_URL=postgres://check@localhost/check REDIS_URL=redis://localhost SENTINEL_SECRET_KEY=check \
		$(VENV)/bin/mypy

lint: check

## Remove the embedded servers' data (stop `make run` first).
clean-data:
	rm -rf .data
