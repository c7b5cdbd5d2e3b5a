# Developer entry points for django-redislock.
#
#   make demo [PORT=8000]   the example project on an embedded Redis (Ctrl-C stops everything)
#   make test [ARGS=...]    the test-suite, as CI runs it (scripts/test.sh)
#   make lint               ruff + mypy
#   make bench [ARGS=...]   benchmarks (benchmarks/bench_locks.py; ARGS=--quick for a short run)
#   make matrix             oldest and newest supported Python/Django/Celery/redis-py (tox)
#
# The first target run creates .venv (PYTHON=... picks the interpreter) and installs the package
# in editable mode with its test, celery, tasks, lint and bench extras; later runs reinstall only
# when setup.cfg or pyproject.toml changed.

VENV ?= .venv
PORT ?= 8000
ARGS ?=
export VENV

BIN := $(VENV)/bin

.PHONY: demo test lint bench matrix venv clean-demo

venv:
	@bash scripts/venv.sh

demo: venv
	$(BIN)/python example_project/run_demo.py --port $(PORT)

test:
	bash scripts/test.sh $(ARGS)

lint: venv
	$(BIN)/ruff check django_redislock tests example_project benchmarks
	$(BIN)/mypy django_redislock

bench: venv
	$(BIN)/python benchmarks/bench_locks.py $(ARGS)

matrix:
	bash scripts/matrix.sh $(ARGS)

# Forget the demo's database, beat schedule and Redis folder (the next `make demo` recreates them).
clean-demo:
	rm -rf example_project/var
