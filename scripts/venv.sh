#!/usr/bin/env bash
# Create the project's virtualenv if it is missing and install the package (editable) with its
# extras. Re-installs only when setup.cfg / pyproject.toml / the extras changed since the last run.
#
#   VENV    where the venv lives (default: .venv in the repository)
#   PYTHON  interpreter to create it with (default: the first python3.1x >= 3.10 found, python3)
#   EXTRAS  extras to install (default: test,celery,tasks,lint,bench)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,celery,tasks,lint,bench}

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
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi

stamp="$VENV/.redislock-install-stamp"
want=$(cat setup.cfg pyproject.toml <(echo "$EXTRAS") | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "venv.sh: pip install -e '.[$EXTRAS]' into $VENV"
    log="$VENV/pip-install.log"
    if ! "$VENV/bin/python" -m pip install -e ".[$EXTRAS]" >"$log" 2>&1; then
        cat "$log" >&2
        echo "venv.sh: pip install failed (log above, also in $log)" >&2
        exit 1
    fi
    echo "$want" >"$stamp"
fi
