# Keyturn: `make serve` to run it, `make test` to test it. Both create .venv on first use.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# `make serve PORT=9000 HOST=0.0.0.0`; otherwise KEYTURN_PORT and KEYTURN_HOST
# (or their defaults, 127.0.0.1:8000) decide, as for `keyturn serve` itself.
HOST ?=
PORT ?=

.PHONY: install serve test test-fast test-db lint format schema clean bench

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Keyturn needs Python 3.11 or newer")'
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

install: $(STAMP)

serve: install
	$(VENV)/bin/keyturn serve $(if $(HOST),--host $(HOST)) $(if $(PORT),--port $(PORT))

# The whole suite; the database is the embedded PostgreSQL unless
# KEYTURN_TEST_DATABASE_URL names another server. Test files run in
# TEST_PROCS processes at once (each with its own PostgreSQL when embedded):
# most of the suite waits on leases, processes and polls rather than the CPU,
# so more processes than cores pay: three on two cores. TEST_PROCS=0 runs
# everything in this one process. The tests marked `serial` press Ctrl-C at
# chosen moments of a start, which a busy machine moves: they run alone,
# after the rest.
TEST_PROCS ?= 3
PARALLEL := $(if $(filter 0,$(TEST_PROCS)),,-n $(TEST_PROCS) --dist loadfile)
test: install
ifeq ($(TEST_PROCS),0)
	$(VENV)/bin/pytest
else
	$(VENV)/bin/pytest $(PARALLEL) -m "not serial"
	$(VENV)/bin/pytest -m serial
endif

# The rules against the database, over HTTP and WebSocket (what CI repeats
# against a second PostgreSQL major version; the slower process-level
# acceptance tests run once, in `make test`). Left out here, as they run the
# same statements as the files kept and test what no PostgreSQL version
# changes: the HTTP front door and its limits, the supervisor, the model and
# MCP adapters, the list completion compared with graphql-core's and the
# HTTP operations compared with Strawberry's execution.
DB_VERSION_FREE := http_spec variables auth query_limits fairness hostile \
	supervision openai_model mcp_tools experiment_mcp_store fast_lists_differential \
	http_path_differential
test-db: install
	$(VENV)/bin/pytest $(PARALLEL) tests/integration tests/migration \
		$(foreach f,$(DB_VERSION_FREE),--ignore=tests/integration/test_$(f).py)

lint: install
	$(VENV)/bin/ruff check keyturn tests bench
	$(VENV)/bin/ruff format --check keyturn tests bench
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports

format: install
	$(VENV)/bin/ruff format keyturn tests bench
	$(VENV)/bin/ruff check --fix keyturn tests bench

# The benchmark (bench/README.md): Keyturn beside its floor and a REST peer.
# A smaller run: make bench BENCH_ARGS="--smoke"
bench: install
	$(PY) -m bench.run $(BENCH_ARGS)

# Rewrites schema.graphql from the code (a test fails when the two drift).
schema: install
	$(VENV)/bin/strawberry export-schema keyturn.schema:schema --output schema.graphql

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache test-artifacts
