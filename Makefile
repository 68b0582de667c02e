# Two commands: `make demo` and `make test`. Everything else is set-up they share.
#
# VENV: where the virtualenv lives (default .venv). CI points it at a shared cache directory
# so repeated runs on one machine reuse it while requirements.lock and pyproject.toml are unchanged.
VENV ?= .venv
UV_VERSION := 0.13.9
SHELL := /bin/bash

# First Python 3.12 that really runs: python3.12 on PATH (a pyenv shim may not), else pyenv's.
PY312 := $(shell for p in $$(command -v python3.12) $$(ls -d $$(pyenv root 2>/dev/null || echo $$HOME/.pyenv)/versions/3.12.*/bin/python 2>/dev/null | sort -rV); do \
  "$$p" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && { echo "$$p"; break; }; done)
STAMP := $(VENV)/.robofleet-installed
# The stamp covers the lock, the project file and this checkout's path (the editable install
# must point at the tree being tested, also when CI reuses one virtualenv across clones).
# VENV_RECIPE: bumped when the set-up steps below change, so an existing virtualenv runs them.
VENV_RECIPE := 2
LOCK_HASH := $(shell { cat requirements.lock pyproject.toml; echo "$(CURDIR) $(VENV_RECIPE)"; } | sha256sum | cut -c1-16)

export HF_HUB_OFFLINE := 1
export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER := 0
export RAY_USAGE_STATS_ENABLED := 0
export MUJOCO_GL ?= egl
export PYTHONDONTWRITEBYTECODE := 1

.PHONY: demo test venv lint typecheck unit lock clean help

help:
	@echo "make demo   set up and run the main job (simulated fleet, HG-DAgger, dashboard)"
	@echo "make test   set up and run lint, type checks and the whole test suite"

# Checked on every run (cheap): installs only when the stamp's hash differs.
INSTALLED := $(shell cat "$(STAMP)" 2>/dev/null)

venv:
ifneq ($(INSTALLED),$(LOCK_HASH))
	@if [ -z "$(PY312)" ]; then \
	  echo "robofleet needs Python 3.12 (LeRobot 0.6 requires it) and found none."; \
	  echo "Install it, e.g.: apt-get install python3.12 python3.12-venv  or  pyenv install 3.12"; \
	  exit 1; fi
	@echo "setting up $(VENV) with $(PY312)"
	@[ -x "$(VENV)/bin/python" ] || "$(PY312)" -m venv "$(VENV)"
	@"$(VENV)/bin/python" -m pip install --quiet --disable-pip-version-check "uv==$(UV_VERSION)"
	"$(VENV)/bin/uv" pip install --python "$(VENV)/bin/python" -r requirements.lock
	"$(VENV)/bin/uv" pip install --python "$(VENV)/bin/python" --no-deps -e .
	@# uv does not write bytecode and PYTHONDONTWRITEBYTECODE (above) keeps imports from
	@# caching it: without this every process (robot computers, learners, each test's
	@# subprocess) compiled torch, lerobot and transformers from source again (8 s more).
	@echo "compiling the installed packages' bytecode"
	@"$(VENV)/bin/python" -m compileall -q -j 0 "$$("$(VENV)/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" > /dev/null
	@echo "$(LOCK_HASH)" > "$(STAMP)"
endif

demo: venv
	"$(VENV)/bin/robofleet" demo $(ARGS)

# ruff, then the house's layers (import-linter contracts in pyproject.toml; docs/architecture.md).
lint: venv
	"$(VENV)/bin/ruff" check .
	"$(VENV)/bin/ruff" format --check .
	"$(VENV)/bin/lint-imports"

typecheck: venv
	"$(VENV)/bin/mypy" foundation buffer comms hal lab_data cloud_learner edge_agent runs dashboard robofleet deploy

# What the suite needs beside the virtualenv, set up here so a newcomer's `make test` is the
# whole suite: Debian's chromium for the browser tests (tools/ensure-chromium) and a throwaway
# loopback PostgreSQL for the postgres-marked tests (tools/with-postgres starts it, installing
# PostgreSQL when missing; a ROBOFLEET_TEST_PG_URL already set is used instead).
#
# TEST_WORKERS: pytest-xdist processes (the suite is sized for two cores). --dist loadfile keeps
# each test file on one worker, and the real-cloud system tests (CLOUD_FILES in tests/conftest.py)
# on one worker together. TEST_WORKERS=0 runs the suite in one process.
#
# --durations=30: the log names the slowest tests, where a loaded CI machine runs out of time.
#
# SUITE_TIMEOUT_S: the whole suite's limit (it takes about 25 minutes on two cores). Each test
# has its own (pytest-timeout, pyproject.toml); this one catches a hang outside any test. On
# expiry the whole process group gets SIGINT, so pytest prints where every worker was and what
# failed so far, and the run fails with that output instead of running into CI's own limit.
TEST_WORKERS ?= 2
SUITE_TIMEOUT_S ?= 3600
unit: venv
	tools/ensure-chromium
	timeout --signal=INT --kill-after=120 $(SUITE_TIMEOUT_S) \
	  tools/with-postgres "$(VENV)/bin/python" -m pytest -n $(TEST_WORKERS) --dist loadfile \
	  --cov --cov-report=term:skip-covered --durations=30 $(PYTEST_ARGS)

test: lint typecheck unit

# Re-resolve requirements.lock from pyproject.toml (needs the registry).
lock: venv
	"$(VENV)/bin/uv" pip compile pyproject.toml --extra all --extra dev --python-version 3.12 \
	  --python-platform x86_64-manylinux_2_28 -o requirements.lock

clean:
	rm -rf .pytest_cache .mypy_cache .ruff_cache .coverage htmlcov
