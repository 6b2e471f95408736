# Two commands do all set-up on a fresh machine with Python 3.11: `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
# Three locks, each complete and hash-checked (docs/contributing.md): requirements.txt (runtime:
# `make run`, the image), requirements-bench.txt (runtime + benchmarks), requirements-test.txt
# (bench + test and lint tools). A stamp per set: a set is reinstalled when its lock, or a lock under
# it, is newer than its stamp.
#
# uv installs them (the runtime set in under a minute; pip takes many). uv reads neither pip.conf nor
# PIP_* variables, so it is handed the wheel folders and indexes pip is configured with: on the
# developers' machines, the folder holding torch's CPU build; elsewhere, what the operator exported
# (docs/operations.md). Every file is hash-checked, so taking the best match across them is safe.
# Locking looks at PyPI and the wheel folders only: a lock holds PyPI's hashes for every platform,
# not the subset some mirror or extra index carries.
pip_config = $(sort $(shell { $(PYTHON) -m pip config list || $(PY) -m pip config list; } 2>/dev/null | sed -n "s/^[^.]*\.$(1)='\(.*\)'$$/\1/p"))
FIND_LINKS = --index-strategy unsafe-best-match $(addprefix --find-links ,$(call pip_config,find-links))
UV_SOURCES = $(FIND_LINKS) $(addprefix --default-index ,$(call pip_config,index-url)) \
	$(addprefix --index ,$(call pip_config,extra-index-url))
# No --compile-bytecode for the runtime set: compiling all of its 22,000 files took most of the
# install (80 of 90 s), and the product imports a sixth of them. `make run` compiles what its
# processes import, once, beside the migrations (sentinel/run.py, compile_imported). The test
# and bench sets do compile: the suite's processes import far more of them.
INSTALL = $(UV) pip install --quiet --python $(PY) --require-hashes $(UV_SOURCES)

.PHONY: run test test-fast check bench lint lock clean-data

# The venv without pip (installing pip into it took longer than everything uv installs without
# compiling); the Python's own pip installs uv into it, or, where that Python has no pip, ensurepip.
$(UV):
	test -x $(PY) || $(PYTHON) -m venv --without-pip $(VENV)
	$(PYTHON) -m pip --python $(PY) install --quiet --require-hashes -r requirements-uv.txt \
		|| { $(PY) -m ensurepip --default-pip && $(PY) -m pip install --quiet --require-hashes -r requirements-uv.txt; }

$(VENV)/.runtime: requirements.txt | $(UV)
	$(INSTALL) -r requirements.txt
	touch $@

$(VENV)/.bench: requirements-bench.txt requirements.txt | $(UV)
	$(INSTALL) --compile-bytecode -r requirements-bench.txt
	touch $@

$(VENV)/.test: requirements-test.txt requirements-bench.txt requirements.txt | $(UV)
	$(INSTALL) --compile-bytecode -r requirements-test.txt
	touch $@

## Start everything (embedded Postgres + Valkey unless DATABASE_URL / REDIS_URL are set).
run: $(VENV)/.runtime
	$(PY) -m sentinel.run

## The whole test suite against real embedded servers, on two pytest-xdist workers (each with its
## own embedded servers, tests/settings.py): TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.test
	$(PY) -m pytest -n $(TEST_WORKERS) --dist worksteal --durations=30

## The tests that need no server (no Postgres, Valkey or subprocess), in about a minute: the URLs
## point nowhere, so nothing embedded starts (docs/contributing.md).
test-fast: $(VENV)/.test
	DATABASE_URL=postgres://fast@127.0.0.1:9/fast REDIS_URL=redis://127.0.0.1:9/0 \
		$(PY) -m pytest -m "not servers and not slow" -q

## Every benchmark scenario (bench/README.md); one alone: make bench SCENARIO=overhead [ARGS="--quick"]
bench: $(VENV)/.bench
	$(PY) -m bench $(SCENARIO) $(ARGS)

## Lint, format check and type check (what CI runs before the tests). Dummy URLs: the type
## checker's Django plugin loads the settings, which would otherwise start the embedded servers.
check: $(VENV)/.test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	DATABASE_URL=postgres://check@localhost/check REDIS_URL=redis://localhost SENTINEL_SECRET_KEY=check \
		$(VENV)/bin/mypy

lint: check

## Re-lock after editing a requirements*.in (docs/contributing.md), keeping every pin it can; move one
## package: make lock LOCK_ARGS="--upgrade-package django". Needs torch's CPU build where pip looks.
lock: | $(UV)
	for set in requirements-uv requirements requirements-bench requirements-test; do \
	  $(UV) pip compile --quiet --generate-hashes --python-version 3.11 --custom-compile-command "make lock" \
	    $(FIND_LINKS) $(LOCK_ARGS) --output-file $$set.txt $$set.in || exit 1; \
	done

## Remove the embedded servers' data (stop `make run` first).
clean-data:
	rm -rf .data
