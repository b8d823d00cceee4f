# Everything a newcomer needs: `make up` runs the stack, `make test` the whole suite.
# Both create .venv (Python 3.11+) and install the locked dependencies when needed.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp

.PHONY: up test test-fast check lock bench clean screenshots

# The dependencies are installed compiled (--compile-bytecode: uv, unlike pip, leaves it
# to the first import, which cannot write it where PYTHONDONTWRITEBYTECODE is set, as in
# many containers): else every process of the stack compiles Prefect, SQLAlchemy and
# pydantic from source at each start, ~4 s of CPU a process (docs/benchmarks.md).
$(STAMP): pyproject.toml requirements.lock Makefile
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@$(BIN)/python -c 'import sys; assert sys.version_info >= (3, 11), "Python 3.11+ needed"'
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv>=0.5"
	$(BIN)/uv pip sync --quiet --compile-bytecode --python $(BIN)/python requirements.lock
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	@touch $(STAMP)

up: $(STAMP)
	$(BIN)/campaign-trigger up

# The test files side by side, one process per core and one more (at most 4), each with
# its own Prefect server, database and sandbox; a file's tests stay together in one
# process. The extra process fills the cores while the others' tests wait (Prefect marking
# a killed worker's run dead takes 40 s a takeover test): with one process per core they
# stood 30 % idle over a run, and the suite took 1,231 s on 2 cores; with three, 982 s
# (2 Dec; docs/benchmarks.md).
# Files are handed out in the order they are collected, the end-to-end ones (the longest)
# first: xdist's default, most tests first, left minutes-long files of a few tests for the
# end, one process running them while the others had nothing left. The slowest tests are
# named at the end: what to look at first when the suite nears CI's time.
# The cores this process may use (sched_getaffinity, Linux), else the machine's (macOS).
TEST_PROCESSES ?= $(shell $(PYTHON) -c 'import os; n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1; print(min(n + 1, 4))')

test: $(STAMP)
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder --durations=15

test-fast: $(STAMP)
	$(BIN)/pytest -m "not slow and not e2e"

check: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy

# Every benchmark of bench/ in quick mode; FULL=1 for the full sizes (the 1 M rows);
# MARKDOWN=FILE also writes the summary as a markdown table.
bench: $(STAMP)
	$(BIN)/python bench/run_all.py $(if $(FULL),--full,) $(if $(MARKDOWN),--markdown $(MARKDOWN),)

# The Prefect UI screenshots of docs/prefect-ui.md (a browser test; needs Debian's chromium).
screenshots: $(STAMP)
	CT_SCREENSHOTS_DIR=$(CURDIR)/docs/img $(BIN)/pytest tests/e2e/ui -q

lock: $(STAMP)
	$(BIN)/uv pip compile --quiet --python $(BIN)/python pyproject.toml --extra dev -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
